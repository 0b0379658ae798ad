"""Compacting a dataset: rewrite only the shards that hold excluded samples, without them.

``shardstream exclude`` leaves the excluded samples' bytes in their shard files, which every
older version still reads. :func:`compact_dataset` makes the next version, in which each shard
with excluded samples is a new file holding only its kept samples
(``compacted/v000004/shard-000012.tar`` and its index, written under their final names before
the version is published); every other shard file is shared with the older versions, and the
new version excludes nothing. The bytes are gone for good once ``shardstream prune`` has
removed the versions that still list the old files (``--keep 1``: only the published one).

A kill leaves the old version published and the new files unlisted; running compact again
writes the same files and publishes the same version (``shardstream abandon`` removes them
instead).
"""

from __future__ import annotations

import concurrent.futures as cf
import logging
import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np

from shardstream._catalog.versions import publish_version
from shardstream._format.columns import (
    column_file,
    import_arrow,
    read_column_table,
    write_columns,
)
from shardstream._format.inspection import write_timm_info
from shardstream._format.manifest import Manifest, read_manifest
from shardstream._format.shardindex import encode_offsets, index_name
from shardstream._format.shardtable import NameColumn, ShardInfo, ShardTable
from shardstream._format.tarformat import TarShardWriter
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream._storage import StorageOptions, Store
from shardstream._storage.store import destination_lock
from shardstream._version import __version__
from shardstream.errors import ConfigError, DatasetExistsError, ShardFormatError
from shardstream.shardwriter import _state as state

__all__ = ["COMPACTED_FOLDER", "compact_dataset"]

logger = logging.getLogger(__name__)

#: Where rewritten shards go: ``compacted/v000004/<the shard's name>``.
COMPACTED_FOLDER = "compacted"
_COMPACTED = re.compile(rf"{COMPACTED_FOLDER}/v\d{{6,}}/")


def compact_dataset(
    dataset: str | os.PathLike[str],
    *,
    workers: int = 4,
    storage_options: StorageOptions = None,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Publish the next version of ``dataset`` with its excluded samples' shards rewritten.

    Args:
        dataset: The dataset folder or URL (not a view, and holding its shards).
        workers: Shards rewritten at once (threads).
        storage_options: fsspec options for a URL.
        progress: Called as ``progress(shards_done, shards)``.

    Returns:
        The new version's manifest (the published one when nothing is excluded).

    Raises:
        ConfigError: A view, or a dataset whose shards or indexes are stored elsewhere.
        DatasetExistsError: A build or append into it is unfinished or running.

    Examples:
        >>> compact_dataset("shards/train").exclusions is None  # doctest: +SKIP
        True
    """
    store = Store(os.fspath(dataset), storage_options)
    with destination_lock(store, "compact"):
        base = _base(store)
        if base.exclusions is None or not len(base.exclusions):
            logger.warning("%s: excludes no samples; nothing to compact", store.shown())
            return base
        version = base.version + 1
        rewritten = _rewrite_all(store, base, version, workers, progress)
        manifest = _manifest(base, rewritten, version)
        write_timm_info(store, manifest)  # like the shards, it precedes the manifest
        publish_version(store, manifest)
    logger.info(
        "%s: version %d: %d shard(s) rewritten without %d excluded samples", store.shown(),
        version, len(rewritten), len(base.exclusions),
    )  # fmt: skip
    return manifest


def _base(store: Store) -> Manifest:
    if store.exists(f"{state.STATE_FOLDER}/{state.PLAN_NAME}"):
        raise DatasetExistsError(
            f"{store.shown()}: a build or append into it is unfinished; run its command again "
            "to finish it (or `shardstream abandon` an append), then compact"
        )
    base = read_manifest(store)
    if base.view is not None or base.shard_root is not None or base.index_root is not None:
        raise ConfigError(
            f"{store.shown()}: is a view or an index of shards stored elsewhere; compact the "
            "dataset that holds the shards (views of it are then made again)"
        )
    return base


def compacted_name(name: str, version: int) -> str:
    """Where version ``version`` puts the rewritten ``name`` (a gzipped shard becomes .tar; a
    shard compacted before keeps its first name)."""
    match = _COMPACTED.match(name)
    if match is not None:
        name = name[match.end() :]
    for suffix in (".tar.gz", ".tgz"):
        if name.endswith(suffix):
            name = name[: -len(suffix)] + ".tar"
    return f"{COMPACTED_FOLDER}/v{version:06d}/{name}"


def _rewrite_all(
    store: Store, base: Manifest, version: int, workers: int,
    progress: Callable[[int, int], None] | None,
) -> dict[int, ShardInfo]:  # fmt: skip
    numbers = base.exclusions.shards().tolist() if base.exclusions is not None else []
    folder = f"{COMPACTED_FOLDER}/v{version:06d}"
    for name in store.list_names(folder):  # a killed run's unfinished files (its own folder)
        if ".tmp-" in name:
            store.remove(f"{folder}/{name}")
    rewritten: dict[int, ShardInfo] = {}
    with cf.ThreadPoolExecutor(max(1, workers)) as pool:
        tasks = {pool.submit(_rewrite, store, base, number, version): number for number in numbers}
        for done, task in enumerate(cf.as_completed(tasks), start=1):
            rewritten[tasks[task]] = task.result()
            if progress is not None:
                progress(done, len(numbers))
    return rewritten


def _rewrite(store: Store, base: Manifest, number: int, version: int) -> ShardInfo:
    """Write shard ``number`` again without its excluded samples, then its index."""
    old = base.shards[number]
    excluded = set(base.exclusions.positions(number).tolist()) if base.exclusions else set()
    name = compacted_name(old.name, version)
    count = 0
    with store.open_read(old.name) as source, store.open_atomic_write(name) as target:
        writer = TarShardWriter(target)
        samples = iter_samples(open_tar(source, store.shown(old.name)))
        for position, (sample, _) in enumerate(samples):
            if position in excluded:
                continue
            key = sample["__key__"]
            writer.start_sample(key)
            for extension, data in sample.items():
                if not extension.startswith("__"):
                    writer.write_member(f"{key}.{extension}", data)
            count += 1
        writer.finish()
    if count != old.num_samples:
        raise ShardFormatError(
            f"{store.shown(old.name)}: holds {count + len(excluded)} samples, version "
            f"{base.version} says {old.num_samples} kept and {len(excluded)} excluded; run "
            "`shardstream verify` on the dataset"
        )
    _rewrite_fields(store, base, number, name, excluded, count + len(excluded))
    index = index_name(name)  # after its shard: a shard counts as written only with its index
    with store.open_atomic_write(index) as stream:
        stream.write(encode_offsets(writer.sample_offsets, writer.key_hashes, writer.digests))
    return ShardInfo(name, count, writer.num_bytes, writer.sha256, index)


def _rewrite_fields(
    store: Store, base: Manifest, number: int, name: str, excluded: set[int], stored: int
) -> None:
    """The attached fields of a rewritten shard, without its excluded samples' rows (in the
    fields' folder, under the new shard's name)."""
    columns = base.columns
    if columns is None or number >= columns.num_shards:
        return
    old = read_column_table(store, column_file(columns.folder, base.shards.names[number]))
    arrow = import_arrow()
    rows = [position for position in range(stored) if position not in excluded]
    taken = old.take(arrow.array(rows, type=arrow.int64()))  # typed: it may be empty
    write_columns(store, column_file(columns.folder, name), taken)


def _manifest(base: Manifest, rewritten: dict[int, ShardInfo], version: int) -> Manifest:
    table = base.shards
    names, indexes = list(table.names), list(table.indexes or [""] * len(table))
    num_bytes = np.array(table.num_bytes, dtype=np.int64)
    sha256 = None if table.sha256 is None else np.array(table.sha256, dtype=np.uint8)
    for number, info in rewritten.items():
        names[number], indexes[number] = info.name, info.index or ""
        num_bytes[number] = info.num_bytes
        if sha256 is not None:
            sha256[number] = np.frombuffer(bytes.fromhex(info.sha256 or ""), np.uint8)
    rest = base.exclusions.without(np.array(list(rewritten))) if base.exclusions else None
    settings: dict[str, Any] = {
        **base.settings, "compaction": {"version": version, "num_shards": len(rewritten)},
    }  # fmt: skip
    new_table = ShardTable(
        NameColumn.of(names), table.num_samples, num_bytes, sha256, NameColumn.of(indexes)
    )
    return Manifest(
        shards=new_table, class_names=base.class_names, settings=settings,
        skipped=base.skipped, created_by=f"shardstream {__version__} compact",
        version=version, exclusions=rest if rest is not None and len(rest) else None,
        columns=base.columns,
    )  # fmt: skip
