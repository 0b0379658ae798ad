"""A short piece of an indexed shard: one read or one memory map, then samples parsed in place.

The default order reads pieces of a few samples from hundreds of places at once, so what a piece
costs beyond its samples' bytes decides the loader's speed, and what it holds decides whether a
worker runs out of file descriptors (``ulimit -n``). A :class:`ShortPiece` borrows a file handle
only while it reads or maps its bytes, on its first sample; it is a plain iterator (nothing to
close), and it holds no descriptor afterwards except the one of its memory map, within the
process's map budget (see :mod:`shardstream.format.filemaps`). A piece is a slice of its
shard's map when the shard can be mapped whole; otherwise a piece below ``COPY_MAX_BYTES`` is
copied, which costs less than a map of its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import IO, Any, cast

import numpy as np

from shardstream.errors import ShardFormatError
from shardstream.format.samples import iter_samples
from shardstream.format.tarfast import parse_plain_sample
from shardstream.format.tarreader import Sample, TarReader
from shardstream.streaming.worker.handles import HandlePool

__all__ = ["COPY_MAX_BYTES", "ShortPiece", "index_mismatch", "read_full_sample"]

#: Pieces up to this size, of shards not mapped whole, are read into memory instead of mapped
#: alone (a map of its own costs about 10 us).
COPY_MAX_BYTES = 64 << 10


class ShortPiece(Iterator[Sample]):
    """Samples ``[start, stop)`` of an indexed shard whose bytes fit one read or map.

    Args:
        pool: Where the shard's file handle is borrowed from.
        name: The shard's name in the pool's store.
        url: The shard's URL for samples and messages (without credentials).
        start: First sample.
        stop: One past the last sample.
        offsets: The shard's index.
        max_member_bytes: Largest sample read by the fast parse (larger: the full reader).
        memory_map: Map local bytes (else read them).
    """

    __slots__ = ("_begin", "_data", "_limit", "_map", "_name", "_next", "_offsets", "_pool",
                 "_previous", "_stop", "_url")  # fmt: skip

    def __init__(
        self,
        pool: HandlePool,
        name: str,
        url: str,
        start: int,
        stop: int,
        offsets: Sequence[int],
        max_member_bytes: int,
        memory_map: bool,
    ) -> None:
        self._pool, self._name, self._url = pool, name, url
        self._next, self._stop, self._offsets = start, stop, offsets
        self._limit, self._map = max_member_bytes, memory_map
        self._begin = int(offsets[start])
        self._data: memoryview | None = None
        self._previous = ""  # the last key read, which errors name

    def __iter__(self) -> ShortPiece:
        return self

    def __next__(self) -> Sample:
        ordinal = self._next
        if ordinal >= self._stop:
            raise StopIteration
        if self._data is None:
            self._data = self._load()  # on the first sample, so errors come from next()
        self._next = ordinal + 1
        here, after = self._offsets[ordinal], self._offsets[ordinal + 1]
        sample = None
        if len(self._data) and after - here <= self._limit:
            begin = self._begin
            sample = parse_plain_sample(self._data[here - begin : after - begin], self._url, here)
        if sample is None:  # short, not plain ustar or broken: the full reader says why
            with self._pool.lend(self._name, here, after) as stream:
                sample = read_full_sample(
                    stream, self._url, ordinal, self._offsets, self._limit, self._previous
                )
        self._previous = sample["__key__"]
        return sample

    def _load(self) -> memoryview:
        """The piece's bytes (empty when they could not all be read: samples then go through
        the full reader, which reports what is wrong)."""
        begin, end = self._begin, int(self._offsets[self._stop])
        if self._map:
            view = self._pool.map(self._name, begin, end, alone=end - begin > COPY_MAX_BYTES)
            if view is not None:
                return view
        with self._pool.lend(self._name, begin, end) as stream:
            buffer = np.empty(end - begin, np.uint8)  # not zeroed: readinto fills it
            if cast(Any, stream).readinto(buffer) == end - begin:
                return memoryview(cast(Any, buffer))
        return memoryview(b"")


def read_full_sample(
    stream: IO[bytes], url: str, ordinal: int, offsets: Sequence[int], limit: int, previous: str
) -> Sample:
    """Sample ``ordinal`` read with the full reader, which handles or reports what it holds.

    Raises:
        ShardFormatError: The bytes the index gives are not exactly one sample, or are broken.
    """
    here, after = offsets[ordinal], offsets[ordinal + 1]
    stream.seek(here)
    reader = TarReader(stream, url, True, here, after, None, limit)
    reader.last_key = previous
    found = list(iter_samples(reader))
    if len(found) != 1 or found[0][1] != here:
        raise index_mismatch(url, ordinal, offsets, found)
    return found[0][0]


def index_mismatch(
    url: str, ordinal: int, offsets: Sequence[int], found: list[tuple[Sample, int]]
) -> ShardFormatError:
    where = f"bytes {offsets[ordinal]}..{offsets[ordinal + 1]}"
    seen = ", ".join(f"{sample['__key__']!r} at byte {offset}" for sample, offset in found[:3])
    return ShardFormatError(
        f"{url}: its index says sample {ordinal} is {where}, but they hold "
        f"{len(found)} sample(s) ({seen or 'none'}); the shard or its index changed after the "
        "build. Rebuild it or run `shardstream verify`."
    )
