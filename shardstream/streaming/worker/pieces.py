"""Reading one piece (samples ``[start, stop)`` of one shard) by byte range.

With the shard's byte-offset index (see :mod:`.handles`), a piece reads exactly the bytes
``[offsets[start], offsets[stop])``: one ranged GET on S3, one memory map locally, no walk over
the members before it. Without one, the shard is walked from the last offset known.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import IO, Any, cast

import numpy as np

from shardstream.errors import ShardFormatError
from shardstream.format.samples import iter_samples
from shardstream.format.tarfast import (
    MAP_WINDOW_BYTES,
    SampleMap,
    map_range,
    parse_plain_sample,
    read_plain_sample,
)
from shardstream.format.tarreader import DEFAULT_MAX_MEMBER_BYTES, Sample, TarReader, open_tar
from shardstream.storage import is_local_url
from shardstream.streaming.worker.handles import HandlePool, OffsetIndex

__all__ = ["read_piece"]


def _position(reader: TarReader, offsets: list[int], start: int) -> int:
    """Move ``reader`` as close to sample ``start`` as the index allows; return that sample."""
    if start == 0 or not reader.seekable:
        return 0
    if len(offsets) <= start:
        known = len(offsets) - 1
        if known > 0:
            reader.seek(offsets[known])
        else:
            known = 0
        for ordinal, (_, offset) in enumerate(iter_samples(reader, want_data=False), known):
            if ordinal == len(offsets):
                offsets.append(offset)
            if ordinal >= start:
                break
    if len(offsets) <= start:
        raise ShardFormatError(
            f"{reader.url}: has {len(offsets)} samples but the manifest says more than {start}; "
            "the shard was changed after the build. Rebuild it or run `shardstream verify`."
        )
    reader.seek(offsets[start])
    return start


def read_piece(
    pool: HandlePool,
    name: str,
    start: int,
    stop: int | None,
    index: OffsetIndex | None = None,
    sample_offsets: Sequence[int] | None = None,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    memory_map: bool = True,
) -> Iterator[Sample]:
    """Yield samples ``start..stop-1`` of shard ``name`` (to the end when ``stop`` is None).

    Handles come from ``pool`` (open local files are reused across pieces). With
    ``sample_offsets`` (the shard's index, see :class:`IndexCache`) only the piece's bytes are
    read, and with ``memory_map`` a local shard's samples are views of a memory map (see
    :class:`~shardstream.format.tarfast.SampleMap`); without an index, the shard is walked
    from the last offset ``index`` knows. No member larger than ``max_member_bytes`` is read
    into memory. Samples carry the shard's URL (without
    credentials) as ``__url__``, and errors name it.

    Raises:
        ShardFormatError: The shard is corrupt, truncated, has fewer than ``stop`` samples, or
            disagrees with its index.

    Example:
        >>> pool = HandlePool(Store("shards/train"))  # doctest: +SKIP
        >>> samples = list(read_piece(pool, "shard-000000.tar", 0, 4))  # doctest: +SKIP
    """
    url = pool.store.shown(name)
    if sample_offsets is not None:  # (returned, not delegated to: one generator less per sample)
        mapped = memory_map and is_local_url(pool.store.url(name))
        return _read_range(pool, name, url, start, stop, sample_offsets, max_member_bytes, mapped)
    return _walk_piece(pool, name, url, start, stop, index, max_member_bytes)


def _walk_piece(
    pool: HandlePool,
    name: str,
    url: str,
    start: int,
    stop: int | None,
    index: OffsetIndex | None,
    max_member_bytes: int,
) -> Iterator[Sample]:
    """Samples ``start..stop-1`` found by walking the shard from the last known offset."""
    offsets = index.get(name) if index is not None else []
    with pool.lend(name) as stream:
        reader = open_tar(stream, url, max_member_bytes)
        ordinal = _position(reader, offsets, start)
        for sample, offset in iter_samples(reader):
            if ordinal == len(offsets):
                offsets.append(offset)
            if ordinal >= start:
                yield sample
            ordinal += 1
            if stop is not None and ordinal >= stop:
                return
    if stop is None:
        return
    raise ShardFormatError(
        f"{url}: has {ordinal} samples but the manifest says at least {stop}; the shard was "
        "changed after the build. Rebuild the dataset or run `shardstream verify`."
    )


def _read_range(
    pool: HandlePool,
    name: str,
    url: str,
    start: int,
    stop: int | None,
    offsets: Sequence[int],
    max_member_bytes: int,
    memory_map: bool,
) -> Iterator[Sample]:
    """Samples ``start..stop-1`` read from exactly their bytes, as the shard's index says.

    Each sample is read up to where the index says the next one starts, so it must start there
    and be exactly one sample: an index that does not match its shard raises instead of
    yielding samples cut in the wrong places, and a corrupt member costs only its own sample.
    """
    last = len(offsets) - 1
    stop = last if stop is None else stop
    if stop > last:
        raise ShardFormatError(
            f"{url}: its index lists {last} samples but the manifest says at least {stop}; the "
            "shard was changed after the build. Rebuild it or run `shardstream verify`."
        )
    begin, end, limit = offsets[start], offsets[stop], max_member_bytes
    if 0 < end - begin <= MAP_WINDOW_BYTES:
        yield from _read_small(pool, name, url, start, stop, offsets, limit, memory_map)
        return
    previous = ""  # the last key read, which errors name
    with pool.lend(name, begin, end) as stream:
        mapped = SampleMap(stream, offsets, stop) if memory_map else None
        for ordinal in range(start, stop):
            here, after = offsets[ordinal], offsets[ordinal + 1]
            if mapped is None:
                sample = read_plain_sample(stream, url, here, after, limit)
            elif after - here <= limit and (view := mapped.view(ordinal)) is not None:
                sample = parse_plain_sample(view, url, here)
            else:  # too large (the full reader reports it) or not mappable: read it
                stream.seek(here)
                sample = read_plain_sample(stream, url, here, after, limit)
            if sample is None:  # not plain ustar, or broken: the full reader handles or reports
                sample = _read_full(stream, url, ordinal, offsets, limit, previous)
            previous = sample["__key__"]
            yield sample


def _read_small(
    pool: HandlePool,
    name: str,
    url: str,
    start: int,
    stop: int,
    offsets: Sequence[int],
    max_member_bytes: int,
    memory_map: bool,
) -> Iterator[Sample]:
    """A short piece (at most one map window) mapped or read at once: no handle stays lent.

    A worker reads from hundreds of places at once with the default order, so a piece must not
    keep its file open while its samples wait in the window (``ulimit -n``); its one map holds
    a descriptor only within the process's map budget (see :func:`map_range`).
    """
    begin, end = offsets[start], offsets[stop]
    data: memoryview | None = None
    with pool.lend(name, begin, end) as stream:
        if memory_map and (fileno := _usable_fileno(stream, end)) is not None:
            data = map_range(fileno, begin, end)
        if data is None:
            buffer = np.empty(end - begin, np.uint8)  # not zeroed: readinto fills it
            if cast(Any, stream).readinto(buffer) == end - begin:
                data = memoryview(cast(Any, buffer))
    previous = ""
    for ordinal in range(start, stop):
        here, after = offsets[ordinal], offsets[ordinal + 1]
        sample = None
        if data is not None and after - here <= max_member_bytes:
            sample = parse_plain_sample(data[here - begin : after - begin], url, here)
        if sample is None:  # short, not plain ustar or broken: the full reader says why
            with pool.lend(name, here, after) as stream:
                sample = _read_full(stream, url, ordinal, offsets, max_member_bytes, previous)
        previous = sample["__key__"]
        yield sample


def _usable_fileno(stream: IO[bytes], end: int) -> int | None:
    """The file descriptor of a local file at least ``end`` bytes long (mapping past the end
    of a file would fault), or None."""
    try:
        fileno = stream.fileno()
        return fileno if os.fstat(fileno).st_size >= end else None
    except (OSError, ValueError):  # no file descriptor (io.UnsupportedOperation is both)
        return None


def _read_full(
    stream: IO[bytes], url: str, ordinal: int, offsets: Sequence[int], limit: int, previous: str
) -> Sample:
    """Sample ``ordinal`` read with the full reader, which handles or reports what it holds."""
    here, after = offsets[ordinal], offsets[ordinal + 1]
    stream.seek(here)
    reader = TarReader(stream, url, True, here, after, None, limit)
    reader.last_key = previous
    found = list(iter_samples(reader))
    if len(found) != 1 or found[0][1] != here:
        raise _index_mismatch(url, ordinal, offsets, found)
    return found[0][0]


def _index_mismatch(
    url: str, ordinal: int, offsets: Sequence[int], found: list[tuple[Sample, int]]
) -> ShardFormatError:
    where = f"bytes {offsets[ordinal]}..{offsets[ordinal + 1]}"
    seen = ", ".join(f"{sample['__key__']!r} at byte {offset}" for sample, offset in found[:3])
    return ShardFormatError(
        f"{url}: its index says sample {ordinal} is {where}, but they hold "
        f"{len(found)} sample(s) ({seen or 'none'}); the shard or its index changed after the "
        "build. Rebuild it or run `shardstream verify`."
    )
