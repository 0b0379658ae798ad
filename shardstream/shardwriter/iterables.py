"""Iterable sources: sample dicts streamed in bounded chunks, in their given order.

An iterable cannot be shuffled globally in constant memory, so its samples are written in the
order given (shuffle it first if it is sorted by class). Samples are encoded here with
:func:`shardstream.format.codecs.encode_member` and grouped into chunks that fit the shard limits
exactly, so each chunk is one shard. Duplicate keys are caught with a set of 64-bit key hashes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from shardstream.errors import DuplicateKeyError, SourceError
from shardstream.format import codecs
from shardstream.format.keys import check_key, key_hash, member_name
from shardstream.format.tarheader import END_BYTES, member_size
from shardstream.shardwriter.options import BuildOptions
from shardstream.shardwriter.tasks import Sample

__all__ = ["chunk_samples", "encode_sample"]


def encode_sample(sample: Mapping[str, Any], position: int) -> Sample:
    """Turn ``{"__key__": ..., "jpg": bytes, "cls": 3, ...}`` into sorted encoded members."""
    where = f"sample #{position}"
    if not isinstance(sample, Mapping):
        raise SourceError(f"{where}: expected a dict with '__key__', got {type(sample).__name__}")
    key = sample.get("__key__")
    if not isinstance(key, str):
        raise SourceError(f"{where}: '__key__' must be a string, got {key!r}")
    where = f"sample #{position} (key {key!r})"
    check_key(key, where)
    members = []
    for extension, value in sample.items():
        if not extension.startswith("__"):
            member_name(key, extension, where)  # refuses a field that would not read back
            members.append((extension, codecs.encode_member(extension, value, where)))
    if not members:
        raise SourceError(f"{where}: no fields besides '__key__'")
    members.sort()
    return key, tuple(members), where


def chunk_samples(
    samples: Iterable[Mapping[str, Any]], options: BuildOptions
) -> Iterator[tuple[tuple[Sample, ...], str]]:
    """Yield ``(samples, digest)`` chunks that each fit one shard; ``digest`` identifies them."""
    limit = options.max_bytes_per_shard - END_BYTES
    max_samples = options.max_samples_per_shard or 2**62
    seen: set[int] = set()
    chunk: list[Sample] = []
    total = 0
    for position, raw in enumerate(samples):
        sample = encode_sample(raw, position)
        _check_unique(sample, seen)
        size = sum(member_size(f"{sample[0]}.{ext}", len(data)) for ext, data in sample[1])
        if chunk and (len(chunk) >= max_samples or total + size > limit):
            yield tuple(chunk), _digest(chunk)
            chunk, total = [], 0
        chunk.append(sample)
        total += size
    if chunk:
        yield tuple(chunk), _digest(chunk)


def _check_unique(sample: Sample, seen: set[int]) -> None:
    hashed = key_hash(sample[0])
    if hashed in seen:
        raise DuplicateKeyError(
            f"{sample[2]}: key {sample[0]!r} was already used by an earlier sample; a shard "
            "holds one sample per key. Make keys unique."
        )
    seen.add(hashed)


def _digest(chunk: list[Sample]) -> str:
    digest = hashlib.sha256()
    for key, members, _ in chunk:
        digest.update(key.encode("utf-8") + b"\0")
        for extension, data in members:
            digest.update(extension.encode("utf-8") + b"\0" + len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.hexdigest()
