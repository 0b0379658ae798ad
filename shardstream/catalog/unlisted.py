"""Shard files that only pruned versions list: what ``prune`` deletes besides manifests.

Appends only add shards, so before ``shardstream compact`` every version's shards are also the
newest version's. A compacted version lists rewritten files in place of the old ones (at the
same shard numbers), so once every version that lists an old file is pruned, the file (and its
index) can go: that is when an excluded sample's bytes are really gone.
"""

from __future__ import annotations

from collections.abc import Sequence

from shardstream.format.columns import column_file
from shardstream.format.manifest import Manifest
from shardstream.format.shardtable import NameColumn

__all__ = ["files_only_in"]


def files_only_in(removed: Manifest, kept: Sequence[Manifest]) -> list[str]:
    """The shard and index files ``removed`` lists that no manifest of ``kept`` lists.

    Shard numbers are stable across versions (appends add after, exclude and compact keep
    them), so a file is compared with the files the other versions list at its number. Shards
    stored elsewhere (``shard_root``, ``index_root``) are never listed: they are not the
    dataset's to delete.

    Examples:
        >>> files_only_in(read_version(store, 1), [read_version(store, 3)])  # doctest: +SKIP
        ['shard-000002.tar', 'shard-000002.idx']
    """
    if removed.shard_root is not None or removed.index_root is not None:
        return []
    files: list[str] = []
    dropped: list[str] = []
    columns = [("names", removed.shards.names), ("indexes", removed.shards.indexes)]
    for attribute, old in columns:
        if old is None:
            continue
        others = [getattr(manifest.shards, attribute) for manifest in kept]
        found = [old[number] for number in _changed(old, others) if old[number]]
        dropped += found if attribute == "names" else []
        files += found
    return files + _field_files(removed, kept, dropped)


def _field_files(removed: Manifest, kept: Sequence[Manifest], dropped: list[str]) -> list[str]:
    """The attached-field files only ``removed`` reads: its folder (``columns/vN/``, ending in
    a slash) when no kept version reads it, else the files of its dropped shards."""
    columns = removed.columns
    if columns is None or columns.root is not None:
        return []
    if all(manifest.columns is None or manifest.columns.folder != columns.folder
           for manifest in kept):  # fmt: skip
        return [f"{columns.folder}/"]
    return [column_file(columns.folder, name) for name in dropped]


def _changed(old: NameColumn, others: Sequence[NameColumn | None]) -> list[int]:
    """The numbers at which no column of ``others`` holds ``old``'s name."""
    present = [column for column in others if column is not None]
    if old.template is not None and any(column.template == old.template for column in present):
        return []  # the same names counting up: nothing was rewritten (the usual case)
    changed = []
    for number, name in enumerate(old):
        if all(number >= len(column) or column[number] != name for column in present):
            changed.append(number)
    return changed
