"""The check a dataset makes of its shard files when it is opened: a manifest that describes
other files (one copied from another dataset) is refused before any worker reads a shard."""

from __future__ import annotations

from shardstream.errors import ManifestError
from shardstream.format.manifest import MANIFEST_NAME, Manifest
from shardstream.storage import Store

__all__ = ["refuse_other_shards"]


def refuse_other_shards(dataset: Store, shards: Store, manifest: Manifest) -> None:
    """Refuse a manifest whose shards are all other files than it describes (one copied from
    another dataset): the first, middle and last local shards' sizes, one stat each. One
    truncated shard among them is left to the reader (``on_error="skip"`` reads the rest)."""
    table = manifest.shards
    if not shards.is_local or len(table) < 2:
        return
    numbers = sorted({0, len(table) // 2, len(table) - 1})
    found = []
    for number in numbers:
        info = table[number]
        try:
            size = shards.size(info.name)
        except OSError:
            return  # a missing shard: the reader names it (or skips it)
        if size == info.num_bytes:
            return
        found.append((info.name, info.num_bytes, size))
    name, expected, size = found[0]
    raise ManifestError(
        f"{dataset.shown(MANIFEST_NAME)}: describes other shards than these: {len(found)} of "
        f"{len(found)} checked differ in size, such as {shards.shown(name)} ({size} bytes, the "
        f"manifest says {expected}); was it copied from another dataset? Restore its own "
        "manifest, or index the shards again (`shardstream index DEST --overwrite`)"
    )
