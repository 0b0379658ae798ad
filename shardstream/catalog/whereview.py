"""Views by a predicate over attached fields: ``make_view(source, dest, where="aesthetic >= 5")``.

The view lists the source version's shards with the counts of the samples whose fields satisfy
the predicate (:class:`~shardstream.format.where.Predicate`), and leaves the others out with an
exclusion list (:mod:`shardstream.format.exclusions`), so it reads, plans and resumes exactly
like any excluded version; its samples carry the source's fields. Making it reads each shard's
field file once, one shard at a time; the exclusion list it writes holds 12 bytes per sample
left out.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

from shardstream.catalog.shardlist import Source, read_dataset
from shardstream.catalog.viewmanifest import view_manifest
from shardstream.catalog.viewrecords import record_view
from shardstream.errors import ConfigError
from shardstream.format.columns import ColumnSet, column_file, read_column_table
from shardstream.format.exclusions import Exclusions
from shardstream.format.manifest import Manifest, write_manifest
from shardstream.format.roots import absolute_root, root_store
from shardstream.format.where import Predicate
from shardstream.storage import StorageOptions, Store

__all__ = ["FILTERED_VERSION", "where_view"]

#: The version an exclusion list gives the samples a view's predicate leaves out.
FILTERED_VERSION = 0


def where_view(
    source: Source,
    dest: str | os.PathLike[str],
    where: str,
    *,
    storage_options: StorageOptions = None,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Write a view of ``source`` into ``dest`` keeping the samples whose fields satisfy ``where``.

    Raises:
        ConfigError: The source is a view or has no attached fields, or the predicate does
            not parse or names a field the source lacks.

    Examples:
        >>> where_view("shards/train", "shards/pretty", "aesthetic >= 5")  # doctest: +SKIP
    """
    predicate = Predicate(where)
    origin, manifest = read_dataset(source, storage_options)
    if manifest.view is not None or manifest.columns is None:
        raise ConfigError(
            f"{origin.shown()}: {'is a view' if manifest.view else 'has no attached fields'}; a "
            "view by fields is made of a dataset with fields (`shardstream attach`)"
        )
    columns, fields = manifest.columns, root_store(origin, manifest.columns.root)
    counts = np.zeros(len(manifest.shards), np.int64)
    left_out = []
    for number, info in enumerate(manifest.shards):
        excluded = np.empty(0, np.int64)
        if manifest.exclusions is not None:
            excluded = manifest.exclusions.positions(number)
        keep = np.zeros(info.num_samples + len(excluded), dtype=bool)
        if number < columns.num_shards:
            keep = predicate.mask(read_column_table(fields, column_file(columns.folder, info.name)))
        keep[excluded] = False
        counts[number] = int(keep.sum())
        left_out.append((np.int64(number) << np.int64(32)) | np.flatnonzero(~keep))
        if progress is not None:
            progress(number + 1, len(manifest.shards))
    view = _view_manifest(origin, manifest, counts, left_out, where, fields)
    target = Store(os.fspath(dest), storage_options)
    target.makedirs()
    write_manifest(target, view)
    record_view(origin, target, manifest.version)
    return view


def _view_manifest(
    origin: Store, manifest: Manifest, counts: np.ndarray, left_out: list[np.ndarray],
    where: str, fields: Store,
) -> Manifest:  # fmt: skip
    places = np.concatenate(left_out) if left_out else np.empty(0, np.int64)
    versions = np.full(len(places), FILTERED_VERSION, np.uint32)
    if manifest.exclusions is not None:  # the source's own exclusions keep their versions
        where_found = np.searchsorted(manifest.exclusions.places, places)
        found = where_found < len(manifest.exclusions)
        found[found] = manifest.exclusions.places[where_found[found]] == places[found]
        versions[found] = manifest.exclusions.versions[where_found[found]]
    columns: Any = manifest.columns
    kept = ColumnSet(columns.folder, columns.fields, columns.num_shards, absolute_root(fields))
    select = {"kind": "where", "where": where}
    return view_manifest(origin, manifest, counts, select, Exclusions(places, versions), kept)
