"""Verify a finished dataset: every shard's bytes, sha256, sample count, member layout and index.

Each shard is read once with the streaming reader's own parser and key rule
(:func:`~shardstream.format.scan.scan_shard`), so verify accepts exactly what training reads.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import numpy as np

from shardstream.errors import ChecksumMismatchError, ShardFormatError
from shardstream.format.manifest import Manifest, ShardInfo, read_manifest
from shardstream.format.roots import root_store, view_selection
from shardstream.format.scan import scan_shard, without_skip_hint
from shardstream.format.selection import Selection
from shardstream.format.shardindex import decode_index
from shardstream.storage import StorageOptions, Store, as_store

__all__ = ["check_shard", "find_problems", "verify_dataset"]


def verify_dataset(
    dataset: Store | str | os.PathLike[str], storage_options: StorageOptions = None
) -> Manifest:
    """Re-read every shard and compare it with the manifest; return the manifest when all match.

    Raises:
        ManifestNotFoundError: ``dataset`` has no manifest.
        ChecksumMismatchError: Some shard differs; the message lists every mismatch.

    Examples:
        >>> verify_dataset("shards/train").num_samples  # doctest: +SKIP
        1281167
    """
    store = as_store(dataset, storage_options)
    manifest = read_manifest(store)
    problems = find_problems(store, manifest)
    if problems:
        raise ChecksumMismatchError(
            f"{store.shown()}: {len(problems)} problem(s) found:\n  "
            + "\n  ".join(problems)
            + "\nRebuild the dataset (shardstream build --overwrite) or restore the shards."
        )
    return manifest


@dataclasses.dataclass(frozen=True)
class _Where:
    """Where a manifest's shards and indexes are, and what its shards may hold."""

    shards: Store
    indexes: Store
    selection: Selection | None  # a view counts only the samples it keeps
    extra_members: bool  # indexed with allow_extra_members: file members outside samples
    foreign: bool  # indexed shards of other tools (directory entries are fine there)


def find_problems(
    dataset: Store, manifest: Manifest, progress: Callable[[int], None] | None = None
) -> list[str]:
    """Every mismatch between the shards and ``manifest``, one message each ([] when none);
    ``progress`` is called with the number of shards checked after each one."""
    settings = manifest.settings
    where = _Where(
        root_store(dataset, manifest.shard_root),
        root_store(dataset, manifest.index_root),
        view_selection(dataset, manifest),
        bool(settings.get("allow_extra_members", False)),
        bool(settings.get("indexed", False)),
    )
    problems: list[str] = []
    excluded = manifest.exclusions
    for number, shard in enumerate(manifest.shards, start=1):
        positions = None if excluded is None else excluded.positions(number - 1)
        problems.extend(check_shard(where.shards, shard, where, positions))
        if progress is not None:
            progress(number)
    return problems


def check_shard(
    dataset: Store, shard: ShardInfo, where: _Where | None = None,
    excluded: np.ndarray | None = None,
) -> list[str]:  # fmt: skip
    """Mismatches of one shard (missing, size, sha256, sample count, member layout, index);
    ``excluded``: the stored positions the version leaves out (not counted in the manifest)."""
    where = where or _Where(dataset, dataset, None, False, False)
    try:
        with dataset.open_read(shard.name) as stream:
            scan = scan_shard(stream, dataset.shown(shard.name))
    except FileNotFoundError:
        return [f"{dataset.shown(shard.name)}: missing (expected {shard.num_bytes} bytes)"]
    problems = list(scan.problems)
    unexpected = (0 if where.extra_members else scan.stray_files) + (
        0 if where.foreign else scan.skipped_members
    )
    if unexpected:
        problems.append(
            f"{shard.name}: {unexpected} unexpected member(s) such as "
            f"{scan.skipped_example!r} (not KEY.EXT file members)"
        )
    if shard.index is not None and scan.offsets is not None:
        problems.extend(_check_index(where.indexes, shard, scan.offsets, scan.digests))
    if scan.num_bytes != shard.num_bytes:
        problems.append(
            f"{shard.name}: size expected {shard.num_bytes} bytes, found {scan.num_bytes}"
        )
    if shard.sha256 is not None and scan.sha256 != shard.sha256:
        problems.append(f"{shard.name}: sha256 expected {shard.sha256}, found {scan.sha256}")
    kept = np.ones(scan.num_samples, dtype=bool)
    if where.selection is not None:
        kept = where.selection.keep(np.asarray(scan.key_hashes, np.int64))
    if excluded is not None and len(excluded):
        if int(excluded[-1]) >= scan.num_samples:
            problems.append(f"{shard.name}: excludes sample {int(excluded[-1])}, beyond its end")
        kept[excluded[excluded < scan.num_samples]] = False
    found = int(kept.sum())
    if found != shard.num_samples:
        problems.append(f"{shard.name}: samples expected {shard.num_samples}, found {found}")
    return problems


def _check_index(
    dataset: Store, shard: ShardInfo, offsets: Sequence[int], digests: bytes | None
) -> list[str]:
    """Compare the shard's index with the sample offsets (and content digests) found while
    scanning the shard."""
    index = shard.index or ""
    try:
        decoded = decode_index(dataset.read_bytes(index), index)
    except FileNotFoundError:
        return [f"{shard.index}: index missing (the manifest names it for {shard.name})"]
    except ShardFormatError as error:
        return [without_skip_hint(str(error))]
    stored = decoded.offsets
    if list(stored) == list(offsets):
        if decoded.digests is None or digests is None or decoded.digests.tobytes() == digests:
            return []
        found = np.frombuffer(digests, np.uint8).reshape(-1, 16)
        if len(found) != len(decoded.digests):
            return [f"{shard.index}: content digests do not match {shard.name}'s samples"]
        sample = int(np.flatnonzero(np.any(found != decoded.digests, axis=1))[0])
        return [f"{shard.index}: sample {sample}'s content digest differs from {shard.name}'s"]
    if len(stored) != len(offsets):
        return [
            f"{shard.index}: index has {len(stored)} offsets, {shard.name} needs {len(offsets)} "
            "(one per sample plus the end)"
        ]
    sample = next(i for i, (a, b) in enumerate(zip(stored, offsets, strict=True)) if a != b)
    return [
        f"{shard.index}: entry {sample} says byte offset {stored[sample]}, but in {shard.name} "
        f"it is {offsets[sample]}"
    ]
