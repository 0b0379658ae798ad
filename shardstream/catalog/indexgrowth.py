"""Indexing a folder of other tools' shards again after it gained shards: only the new ones.

The dataset's manifest lists the shards it indexed, in listing order. When the listing now
holds those same names first and more after them, only the new shards are read; the new
version lists the old shards unchanged (names, counts, checksums, indexes) followed by the new
ones, and is published like an append (:func:`shardstream.catalog.versions.publish_version`).
"""

from __future__ import annotations

import re

from shardstream.errors import DatasetExistsError
from shardstream.format.manifest import MANIFEST_NAME, Manifest, read_manifest
from shardstream.storage import Store

__all__ = ["new_shards"]

_COMPACTED = re.compile(r"compacted/v\d{6,}/")


def new_shards(
    target: Store, names: list[str], overwrite: bool
) -> tuple[Manifest | None, list[str]]:
    """The indexed dataset in ``target`` (None: index from scratch) and the names to index.

    Raises:
        DatasetExistsError: ``target`` holds a built (not indexed) dataset, or the listing no
            longer starts with the indexed shards (names the first difference).
    """
    if overwrite or not target.exists(MANIFEST_NAME):
        return None, names
    base = read_manifest(target)
    shown = target.shown()
    if not base.settings.get("indexed"):
        raise DatasetExistsError(
            f"{shown}: already holds a dataset built by `shardstream build`; add samples to it "
            "with `shardstream build SOURCE DATASET --append`, or pass overwrite=True "
            "(--overwrite) to index the shards from scratch"
        )
    # Shards `compact` rewrote are listed under compacted/vN/: their first names, still in the
    # folder until `prune` removes them, are neither indexed shards nor new ones.
    old = [name for name in base.shards.names if _COMPACTED.match(name) is None]
    replaced = {name[match.end() :] for name in base.shards.names
                if (match := _COMPACTED.match(name)) is not None}  # fmt: skip
    names = [name for name in names if name not in replaced]
    for number, name in enumerate(old):
        found = names[number] if number < len(names) else None
        if found != name:
            raise DatasetExistsError(
                f"{shown}: its manifest lists {name} as shard {number}, but the listing now has "
                f"{found or 'no shard there'}: shards were removed or renamed, or new ones sort "
                "before old ones. Name new shards so that they sort after the indexed ones, or "
                "pass overwrite=True (--overwrite) to index every shard again (new numbering)."
            )
    return base, names[len(old) :]
