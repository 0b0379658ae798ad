"""Verify a finished dataset: every shard's bytes, sha256, sample count, member layout and index."""

from __future__ import annotations

import hashlib
import os
import tarfile
from typing import IO

from shardstream.errors import ChecksumMismatchError, ShardFormatError
from shardstream.manifest import Manifest, ShardInfo, read_manifest
from shardstream.shardindex import decode_offsets
from shardstream.storage import StorageOptions, Store, as_store

__all__ = ["find_problems", "verify_dataset"]


class _HashingReader:
    """A read-only stream wrapper that hashes and counts what passes through."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self.hash = hashlib.sha256()
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.hash.update(data)
        self.num_bytes += len(data)
        return data

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


def verify_dataset(
    dataset: Store | str | os.PathLike[str], storage_options: StorageOptions = None
) -> Manifest:
    """Re-read every shard and compare it with the manifest; return the manifest when all match.

    Raises:
        ManifestNotFoundError: ``dataset_url`` has no manifest.
        ChecksumMismatchError: Some shard differs; the message lists every mismatch.

    Example:
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


def find_problems(dataset: Store, manifest: Manifest) -> list[str]:
    """Every mismatch between the shards and ``manifest``, one message each ([] when none)."""
    problems: list[str] = []
    for shard in manifest.shards:
        problems.extend(check_shard(dataset, shard))
    return problems


def check_shard(dataset: Store, shard: ShardInfo) -> list[str]:
    """Mismatches of one shard (missing, size, sha256, sample count, member layout, index)."""
    try:
        stream = dataset.open_read(shard.name)
    except FileNotFoundError:
        return [f"{shard.name}: missing (expected {shard.num_bytes} bytes)"]
    offsets: list[int] = []
    with stream:
        reader = _HashingReader(stream)
        num_samples, layout_problems = _count_samples(reader, shard.name, offsets)
        reader.drain()
    problems = list(layout_problems)
    if shard.index is not None and not layout_problems:
        problems.extend(_check_index(dataset, shard, offsets))
    if reader.num_bytes != shard.num_bytes:
        problems.append(
            f"{shard.name}: size expected {shard.num_bytes} bytes, found {reader.num_bytes}"
        )
    if reader.hash.hexdigest() != shard.sha256:
        problems.append(
            f"{shard.name}: sha256 expected {shard.sha256}, found {reader.hash.hexdigest()}"
        )
    if num_samples != shard.num_samples:
        problems.append(f"{shard.name}: samples expected {shard.num_samples}, found {num_samples}")
    return problems


def _check_index(dataset: Store, shard: ShardInfo, offsets: list[int]) -> list[str]:
    """Compare the shard's index with the sample offsets found while parsing the shard."""
    index = shard.index or ""
    try:
        stored = decode_offsets(dataset.read_bytes(index), index)
    except FileNotFoundError:
        return [f"{shard.index}: index missing (the manifest names it for {shard.name})"]
    except ShardFormatError as error:
        return [str(error)]
    if list(stored) == offsets:
        return []
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


def _count_samples(reader: _HashingReader, name: str, offsets: list[int]) -> tuple[int, list[str]]:
    """Count samples and check their layout; ``offsets`` gets each sample's start and the end."""
    problems: list[str] = []
    finished: set[str] = set()
    current: str | None = None
    count = end = 0
    try:
        with tarfile.open(fileobj=reader, mode="r|") as archive:  # type: ignore[call-overload]
            for member in archive:
                key = _key_of(member.name)
                if key is None or not member.isfile():
                    problems.append(f"{name}: unexpected member {member.name!r} (not KEY.EXT)")
                    continue
                end = member.offset_data + -(-member.size // 512) * 512
                if key != current:
                    offsets.append(member.offset)
                    if key in finished:
                        problems.append(f"{name}: samples of key {key!r} are not contiguous")
                    if current is not None:
                        finished.add(current)
                    current, count = key, count + 1
    except (tarfile.TarError, EOFError, OSError) as error:
        problems.append(f"{name}: not a valid tar after {reader.num_bytes} bytes ({error})")
    offsets.append(end)
    return count, problems


def _key_of(member_name: str) -> str | None:
    folder, _, base = member_name.rpartition("/")
    stem, dot, _ = base.partition(".")
    if not dot or not stem:
        return None
    return f"{folder}/{stem}" if folder else stem
