"""The two passes of ``shardstream dups``, as tasks that run in-process, on processes or on any
executor (Dask), in memory bounded by one task's shards and one bucket of digests.

1. :func:`digest_task`: the kept samples of a range of one dataset's shards as 32-byte records
   (content digest, dataset, shard, position), read from the shards' indexes (the shard itself
   when its index has no digests), sorted by bucket (the digest's first bits) into one part
   file with each bucket's byte range.
2. :func:`group_task`: one bucket's records from every part file, sorted; records whose digest
   another record shares are written to the bucket's group file, and counted.

Records of equal content land in the same bucket, so a bucket alone finds all their groups.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from typing import Any

import numpy as np

from shardstream.catalog.shardlist import read_dataset, source_of
from shardstream.format.scan import scan_shard
from shardstream.format.shardindex import decode_index
from shardstream.storage import Store

__all__ = [
    "RECORD",
    "DigestTask",
    "GroupTask",
    "count_groups",
    "digest_task",
    "group_starts",
    "group_task",
    "opened_source",
    "sample_offsets",
]

#: One kept sample: its content digest, which dataset, shard and stored position it is.
RECORD = np.dtype(
    [("d0", "<u8"), ("d1", "<u8"), ("dataset", "<u4"), ("shard", "<u4"), ("position", "<u4"),
     ("unused", "<u4")]
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class DigestTask:
    """Shards ``[first, stop)`` of dataset ``dataset`` (read at ``version``) into part ``name``."""

    dataset: int
    source: str
    version: int
    storage_options: str  # JSON: tasks pickle to other processes
    first: int
    stop: int
    bits: int
    work: Store
    name: str


@dataclasses.dataclass(frozen=True)
class GroupTask:
    """Bucket ``bucket``: its byte range in each part file."""

    bucket: int
    parts: tuple[tuple[str, int, int], ...]
    work: Store
    num_datasets: int


@functools.lru_cache(maxsize=8)
def opened_source(source: str, version: int, storage_options: str) -> tuple[Store, Any]:
    """A dataset's store and shard source, once per process (tasks of one dataset share it)."""
    store, manifest = read_dataset(source, json.loads(storage_options) or None, version=version)
    return store, source_of(store, manifest)


@functools.lru_cache(maxsize=64)
def sample_offsets(source: str, version: int, storage_options: str, shard: int) -> tuple[str, Any]:
    """A shard's name and its samples' byte offsets (from its index), once per process."""
    _, opened = opened_source(source, version, storage_options)
    info = opened.table[shard]
    index = decode_index(opened.indexes.read_bytes(info.index), opened.indexes.shown(info.index))
    return info.name, index.offsets


def digest_task(task: DigestTask) -> dict[str, Any]:
    """Pass 1 for a range of shards; returns the part's bucket ranges and what it read."""
    _, source = opened_source(task.source, task.version, task.storage_options)
    parts, read_whole = [], 0
    for number in range(task.first, task.stop):
        records, whole = _shard_records(source, number, task.dataset)
        parts.append(records)
        read_whole += whole
    records = np.concatenate(parts) if parts else np.empty(0, RECORD)
    buckets = np.zeros(len(records), np.int64)
    if task.bits:
        buckets = (records["d0"] >> np.uint64(64 - task.bits)).astype(np.int64)
    order = np.argsort(buckets, kind="stable")
    records = records[order]
    edges = np.searchsorted(buckets[order], np.arange((1 << task.bits) + 1))
    with task.work.open_atomic_write(task.name) as stream:
        stream.write(records.tobytes())
    return {"name": task.name, "edges": (edges * RECORD.itemsize).tolist(),
            "samples": len(records), "read_whole": read_whole}  # fmt: skip


def _shard_records(source: Any, number: int, dataset: int) -> tuple[np.ndarray, int]:
    """The records of one shard's kept samples, and 1 when the shard had to be read whole."""
    info = source.table[number]
    index = None
    if info.index is not None:
        shown = source.indexes.shown(info.index)
        index = decode_index(source.indexes.read_bytes(info.index), shown)
    whole = 0
    if index is not None and index.digests is not None:
        digests, hashes = index.digests, index.key_hashes
    else:  # an older index: digest the samples from the shard's bytes
        with source.shards.open_read(info.name) as stream:
            scan = scan_shard(stream, source.shards.shown(info.name))
        digests = np.frombuffer(scan.digests or b"", np.uint8).reshape(-1, 16)
        hashes, whole = np.asarray(scan.key_hashes, np.int64), 1
    excluded = source.exclusions.count(number) if source.exclusions is not None else 0
    kept = source.kept(number, info.num_samples + excluded, hashes)
    words = digests.view("<u8").reshape(-1, 2)[kept]
    records = np.zeros(len(kept), RECORD)
    records["d0"], records["d1"] = words[:, 0].byteswap(), words[:, 1].byteswap()
    records["dataset"], records["shard"], records["position"] = dataset, number, kept
    return records, whole


def group_task(task: GroupTask) -> dict[str, Any]:
    """Pass 2 for one bucket: write its groups' records (sorted) and count them."""
    chunks = []
    for name, start, stop in task.parts:
        if stop > start:
            with task.work.open_read(name, start, stop) as stream:
                chunks.append(stream.read())
    records = np.frombuffer(b"".join(chunks), RECORD)
    order = np.lexsort(
        (records["position"], records["shard"], records["dataset"], records["d1"], records["d0"])
    )
    records = records[order]
    same = (records["d0"][1:] == records["d0"][:-1]) & (records["d1"][1:] == records["d1"][:-1])
    member = np.zeros(len(records), dtype=bool)
    member[1:] |= same
    member[:-1] |= same
    grouped = records[member]
    name = f"groups-{task.bucket:05d}.bin"
    with task.work.open_atomic_write(name) as stream:
        stream.write(grouped.tobytes())
    return {"name": name, **count_groups(grouped, task.num_datasets)}


def group_starts(grouped: np.ndarray) -> np.ndarray:
    """Where each group begins in sorted group records (then their length)."""
    if not len(grouped):
        return np.zeros(1, np.int64)
    new = np.ones(len(grouped), dtype=bool)
    new[1:] = (grouped["d0"][1:] != grouped["d0"][:-1]) | (grouped["d1"][1:] != grouped["d1"][:-1])
    return np.append(np.flatnonzero(new), len(grouped))


def count_groups(grouped: np.ndarray, num_datasets: int) -> dict[str, Any]:
    """Groups, and per dataset: samples in groups, beyond the first of each, and leaked (in a
    group with another dataset's sample)."""
    starts = group_starts(grouped)
    sizes = np.diff(starts)
    first = np.zeros(len(grouped), dtype=bool)
    first[starts[:-1]] = True
    datasets = grouped["dataset"].astype(np.int64)
    lowest = np.minimum.reduceat(datasets, starts[:-1]) if len(grouped) else datasets
    highest = np.maximum.reduceat(datasets, starts[:-1]) if len(grouped) else datasets
    crossing = np.repeat(lowest != highest, sizes)
    count = functools.partial(np.bincount, minlength=num_datasets)
    return {
        "groups": len(sizes),
        "crossing_groups": int((lowest != highest).sum()),
        "in_groups": count(datasets).tolist(),
        "beyond_first": count(datasets[~first]).tolist(),
        "leaked": count(datasets[crossing]).tolist(),
        "largest": int(sizes.max()) if len(sizes) else 0,
    }
