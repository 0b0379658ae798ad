"""The two passes of ``shardstream dups``, as tasks that run in-process, on processes or on any
executor (Dask), in memory bounded by one task's shards and one bucket of digests.

1. :func:`digest_task`: the kept samples of a range of one dataset's shards as 32-byte records
   (content digest, dataset, shard, position), read from the shards' indexes (the shard itself
   when its index has no digests), sorted by bucket (the digest's first bits) into one part
   file with each bucket's byte range.
2. :func:`group_task`: one bucket's records from every part file, sorted; records whose digest
   another record shares are written to the bucket's group file, and counted.

Records of equal content land in the same bucket, so a bucket alone finds all their groups.

``shardstream dups``: exact duplicate samples within and across datasets, from their indexes.

Samples whose content digests (:mod:`shardstream._format.keys`) are equal form a group: the
same image stored twice in a training set, or a test image that leaked into training. Digests
come from the shards' indexes (version 3, written by the build and by ``shardstream index``);
a shard whose index predates them is read whole instead. The search runs in two passes of
tasks (:mod:`shardstream._catalog.dups`): records partitioned by digest into buckets on disk,
then each bucket sorted alone; memory is bounded by ``max_bucket_bytes`` (and by a task's
shards), never by the datasets. The tasks run in this process, on local processes
(``workers``) or on any executor (a Dask client's), sharing ``work_dir``.

For ``shardstream exclude``, the samples of the first dataset to drop are written as
``SHARD<TAB>KEY`` lines: ``"extra"`` drops all but the first of each group (the first dataset
comes first), ``"leaked"`` every sample of a group that another dataset's sample shares."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import functools
import itertools
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from shardstream._catalog.execute import run_tasks
from shardstream._catalog.shardlist import read_dataset, source_of
from shardstream._format.shardindex import decode_index
from shardstream._format.tarreader import KEY_READ_BYTES, key_at
from shardstream._format.verify import scan_shard
from shardstream._storage import StorageOptions, Store
from shardstream.errors import ConfigError

__all__ = [
    "DigestTask",
    "DuplicateReport",
    "GroupTask",
    "RECORD",
    "count_groups",
    "digest_task",
    "find_duplicates",
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


DROP_POLICIES = ("extra", "leaked")
#: Shards one pass-1 task reads (its records are held at once: 32 bytes per sample).
SHARDS_PER_TASK = 256


@dataclasses.dataclass
class DuplicateReport:
    """What :func:`find_duplicates` found.

    Attributes:
        datasets: Per dataset: ``source``, ``version``, ``samples`` and ``read_whole`` (shards
            whose indexes had no digests, read whole).
        groups: Groups of two or more samples with equal content.
        crossing_groups: Groups that hold samples of more than one dataset (leaks).
        in_groups: Per dataset, its samples in some group.
        beyond_first: Per dataset, its samples that are not the first of their group.
        leaked: Per dataset, its samples in a group with another dataset's sample.
        largest: The size of the largest group.
        examples: A few groups: ``digest``, ``size`` and ``members`` (``dataset``, ``shard``,
            ``key``), crossing groups first.
        keys_written: Lines written to the keys file (0 without one).
    """

    datasets: list[dict[str, Any]]
    groups: int = 0
    crossing_groups: int = 0
    in_groups: list[int] = dataclasses.field(default_factory=list)
    beyond_first: list[int] = dataclasses.field(default_factory=list)
    leaked: list[int] = dataclasses.field(default_factory=list)
    largest: int = 0
    examples: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    keys_written: int = 0

    def as_dict(self) -> dict[str, Any]:
        """Plain values (for ``--json``)."""
        return dataclasses.asdict(self)


def find_duplicates(
    sources: Sequence[str | os.PathLike[str]],
    *,
    keys_out: str | os.PathLike[str] | None = None,
    drop: str = "extra",
    examples: int = 5,
    workers: int = 1,
    executor: cf.Executor | None = None,
    work_dir: str | None = None,
    max_bucket_bytes: int = 64 << 20,
    storage_options: StorageOptions = None,
    progress: Callable[[int, int], None] | None = None,
) -> DuplicateReport:
    """Find groups of samples with equal content in one dataset or across several.

    Args:
        sources: Dataset folders or URLs (built, indexed, views; each read at its newest
            version, excluded samples left out). The first one is the one ``keys_out`` lists.
        keys_out: Write the first dataset's samples to drop here (``SHARD<TAB>KEY`` lines, what
            ``shardstream exclude --keys`` takes).
        drop: ``"extra"`` (all but the first of each group) or ``"leaked"`` (every sample of a
            group that another dataset shares).
        examples: Groups to describe with their keys.
        workers: Local processes for the passes (ignored with an executor).
        executor: Runs the tasks, e.g. ``distributed.Client(...).get_executor()``; then give a
            ``work_dir`` every worker can reach (an S3 prefix, a shared folder).
        work_dir: Where the passes write their records (default: a temporary local folder,
            removed after).
        max_bucket_bytes: Records sorted at once (32 bytes per sample): the memory bound.
        storage_options: fsspec options for remote URLs (datasets and ``work_dir``).
        progress: Called as ``progress(tasks_done, tasks)`` over both passes.

    Raises:
        ConfigError: No source, or an unknown ``drop``.

    Examples:
        >>> report = find_duplicates(["shards/train", "shards/test"], keys_out="leaks.txt",
        ...                          drop="leaked")  # doctest: +SKIP
        >>> report.crossing_groups, report.keys_written  # doctest: +SKIP
        (70, 84)
    """
    if not sources or drop not in DROP_POLICIES:
        raise ConfigError(f"dups takes one or more datasets and drop in {DROP_POLICIES}")
    opened = [_describe(os.fspath(source), storage_options) for source in sources]
    total = sum(item["samples"] for item in opened)
    buckets = max(1.0, total * RECORD.itemsize / max_bucket_bytes)
    bits = min(12, math.ceil(math.log2(buckets)))
    with _work(work_dir, storage_options) as work:
        parts = _first_pass(opened, bits, work, storage_options, workers, executor, progress)
        shown = [{k: v for k, v in item.items() if k != "shards"} for item in opened]
        report = DuplicateReport(datasets=shown)
        for item, read in zip(report.datasets, _read_whole(parts, len(opened)), strict=True):
            item["read_whole"] = read
        counts = _second_pass(parts, bits, work, len(opened), workers, executor, progress)
        _add_counts(report, counts, len(opened))
        names = [count["name"] for count in sorted(counts, key=lambda c: c["name"])]
        report.examples = _examples(work, names, opened, examples, storage_options)
        if keys_out is not None:
            report.keys_written = _write_keys(
                work, names, opened[0], drop, keys_out, storage_options
            )
    return report


def _describe(source: str, storage_options: StorageOptions) -> dict[str, Any]:
    store, manifest = read_dataset(source, storage_options)
    version = None if source.endswith(".json") else manifest.version
    return {"source": source, "shown": store.shown(), "version": version,
            "samples": manifest.num_samples, "shards": len(manifest.shards)}  # fmt: skip


@contextlib.contextmanager
def _work(work_dir: str | None, storage_options: StorageOptions) -> Iterator[Store]:
    if work_dir is not None:
        store = Store(work_dir, storage_options)
        store.makedirs()
        yield store
        return
    with tempfile.TemporaryDirectory(prefix="shardstream-dups-") as folder:
        yield Store(folder)


def _first_pass(
    opened: list[dict[str, Any]], bits: int, work: Store, storage_options: StorageOptions,
    workers: int, executor: cf.Executor | None, progress: Callable[[int, int], None] | None,
) -> list[dict[str, Any]]:  # fmt: skip
    options = json.dumps(dict(storage_options or {}), sort_keys=True)
    tasks = [
        DigestTask(number, item["source"], item["version"], options, first,
                   min(first + SHARDS_PER_TASK, item["shards"]), bits, work,
                   f"part-{number:03d}-{first // SHARDS_PER_TASK:07d}.bin")
        for number, item in enumerate(opened)
        for first in range(0, item["shards"], SHARDS_PER_TASK)
    ]  # fmt: skip
    parts: list[dict[str, Any]] = []
    total = len(tasks) + (1 << bits)

    def done(result: dict[str, Any]) -> None:
        parts.append(result)
        if progress is not None:
            progress(len(parts), total)

    run_tasks(digest_task, tasks, done, workers, executor)
    return sorted(parts, key=lambda part: part["name"])


def _read_whole(parts: list[dict[str, Any]], num_datasets: int) -> list[int]:
    counts = [0] * num_datasets
    for part in parts:
        counts[int(part["name"].split("-")[1])] += part["read_whole"]
    return counts


def _second_pass(
    parts: list[dict[str, Any]], bits: int, work: Store, num_datasets: int, workers: int,
    executor: cf.Executor | None, progress: Callable[[int, int], None] | None,
) -> list[dict[str, Any]]:  # fmt: skip
    tasks = [
        GroupTask(bucket, tuple((part["name"], part["edges"][bucket], part["edges"][bucket + 1])
                                for part in parts), work, num_datasets)
        for bucket in range(1 << bits)
    ]  # fmt: skip
    counts: list[dict[str, Any]] = []

    def done(result: dict[str, Any]) -> None:
        counts.append(result)
        if progress is not None:
            progress(len(parts) + len(counts), len(parts) + len(tasks))

    run_tasks(group_task, tasks, done, workers, executor)
    return counts


def _add_counts(report: DuplicateReport, counts: list[dict[str, Any]], num_datasets: int) -> None:
    for field in ("in_groups", "beyond_first", "leaked"):
        summed = np.zeros(num_datasets, np.int64)
        for count in counts:
            summed += np.asarray(count[field], np.int64)
        setattr(report, field, summed.tolist())
    report.groups = sum(count["groups"] for count in counts)
    report.crossing_groups = sum(count["crossing_groups"] for count in counts)
    report.largest = max((count["largest"] for count in counts), default=0)


def _groups(work: Store, names: list[str]) -> Iterator[np.ndarray]:
    """Every group's records, bucket after bucket (one bucket in memory at a time)."""
    for name in names:
        records = np.frombuffer(work.read_bytes(name), RECORD)
        starts = group_starts(records)
        for first, stop in itertools.pairwise(starts.tolist()):
            yield records[first:stop]


def _examples(
    work: Store, names: list[str], opened: list[dict[str, Any]], wanted: int,
    storage_options: StorageOptions,
) -> list[dict[str, Any]]:  # fmt: skip
    crossing: list[np.ndarray] = []
    within: list[np.ndarray] = []
    for group in _groups(work, names):
        kind = crossing if len(set(group["dataset"].tolist())) > 1 else within
        if len(kind) < wanted:
            kind.append(group)
        if len(crossing) >= wanted and len(within) >= wanted:
            break
    return [_described(group, opened, storage_options) for group in (crossing + within)[:wanted]]


def _described(
    group: np.ndarray, opened: list[dict[str, Any]], storage_options: StorageOptions
) -> dict[str, Any]:
    digest = f"{int(group['d0'][0]):016x}{int(group['d1'][0]):016x}"
    members = []
    for record in group[:10]:
        item = opened[int(record["dataset"])]
        shard, key = _key(item, int(record["shard"]), int(record["position"]), storage_options)
        members.append({"dataset": item["shown"], "shard": shard, "key": key})
    return {"digest": digest, "size": len(group), "members": members}


def _key(
    item: dict[str, Any], shard: int, position: int, storage_options: StorageOptions
) -> tuple[str, str]:
    """The shard name and key of a dataset's stored sample (its index, then its first header)."""
    options = json.dumps(dict(storage_options or {}), sort_keys=True)
    _, source = opened_source(item["source"], item["version"], options)
    name, offsets = sample_offsets(item["source"], item["version"], options, shard)
    offset = int(offsets[position])
    with source.shards.open_read(name, offset, offset + KEY_READ_BYTES) as stream:
        return name, key_at(stream.read(), source.shards.shown(name))


def _write_keys(
    work: Store, names: list[str], first: dict[str, Any], drop: str,
    keys_out: str | os.PathLike[str], storage_options: StorageOptions,
) -> int:  # fmt: skip
    """Write the first dataset's samples to drop as ``SHARD<TAB>KEY`` lines; return how many."""
    chosen = []
    for group in _groups(work, names):
        mine = group["dataset"] == 0
        if drop == "extra":
            mine[0] = False  # the group's first sample stays
        elif group["dataset"].max() == 0:
            continue  # not leaked: no other dataset has it
        chosen.append(group[mine])
    records = np.concatenate(chosen) if chosen else np.empty(0, RECORD)
    records = records[np.lexsort((records["position"], records["shard"]))]
    with open(keys_out, "w", encoding="utf-8") as stream:
        for record in records:  # an index read per shard, a header read per sample
            shard, key = _key(first, int(record["shard"]), int(record["position"]),
                              storage_options)  # fmt: skip
            stream.write(f"{shard}\t{key}\n")
    return len(records)
