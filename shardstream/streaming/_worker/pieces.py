"""What a worker knows of its shards' samples between pieces: indexes and walked offsets.

A worker reads many short pieces, several from the same shard. When the shard has a byte-offset
index (``shard-NNNNNN.idx``), the worker loads it once into a small :class:`IndexCache` (kept
across epochs in the process). Shards without an index (made by other tools, not yet indexed)
are walked from byte 0, and each walk records the offsets it passes in a bounded
:class:`OffsetIndex`, so later pieces of that shard start closer. File handles and memory maps
are storage's (:meth:`shardstream._storage.Store.ranges`).

Opening one piece (samples ``[start, stop)`` of one shard): the one place a worker does it.

With the shard's byte-offset index (see this module), a piece asks storage for exactly the
bytes ``[offsets[start], offsets[stop])`` (:class:`~shardstream._storage.ranges.Ranges`: a slice
of the shard's memory map locally, ranged requests on an object store, taken over from an
announcement when one is under way) and parses its samples in place; no walk over the members
before it. Without one, the shard is walked from the last offset known.

The default order reads pieces of a few samples from hundreds of places at once, so what a piece
costs beyond its samples' bytes decides the loader's speed, and what it holds decides whether a
worker runs out of file descriptors (``ulimit -n``). A :class:`ShortPiece` borrows a file handle
only while it reads its bytes, on its first sample; it is a plain iterator (nothing to close),
and holds no descriptor afterwards except the one of its memory map, within the process's map
budget. A piece is a slice of its shard's map when the shard can be mapped whole; otherwise a
piece below ``COPY_MAX_BYTES`` is copied, which costs less than a map of its own."""

from __future__ import annotations

import collections
import io
import logging
import os
import threading
from collections.abc import Iterator, Sequence
from typing import IO, Any, cast

import numpy as np

from shardstream._format.shardindex import ShardIndex, decode_index, index_version
from shardstream._format.tarreader import (
    DEFAULT_MAX_MEMBER_BYTES,
    Sample,
    TarReader,
    iter_samples,
    open_tar,
    parse_plain_sample,
    read_full_sample,
    read_plain_sample,
)
from shardstream._storage import Store
from shardstream._storage.backends.localmaps import still_holds
from shardstream._storage.background import ProcessLocal
from shardstream._storage.ranges import Ranges
from shardstream._storage.store import read_ranges
from shardstream.errors import ShardFormatError

__all__ = [
    "COPY_MAX_BYTES",
    "IndexCache",
    "OffsetIndex",
    "SHORT_PIECE_BYTES",
    "ShortPiece",
    "open_piece",
]


logger = logging.getLogger("shardstream.streaming")
#: An index of 16M samples; real shards hold thousands.
_MAX_INDEX_BYTES = 128 << 20


class IndexCache:
    """Byte-offset indexes of recently read shards, loaded once each (least recently used dropped).

    An index that cannot be read or is corrupt is logged once and remembered as missing: pieces
    of that shard are then read by walking the shard, as for shards without an index.

    Args:
        store: Where the indexes are.
        max_shards: Indexes kept; memory is 8 bytes per sample of each.

    Examples:
        >>> cache = IndexCache(Store("shards/train"))  # doctest: +SKIP
        >>> offsets = cache.get("shard-000000.idx")  # doctest: +SKIP
    """

    def __init__(self, store: Store, max_shards: int = 256) -> None:
        self._store = store
        self._max_shards = max_shards
        self._indexes: collections.OrderedDict[str, ShardIndex | None] = collections.OrderedDict()
        # The threads of a thread loader share the process's cache (the reads run unlocked).
        self._lock = threading.Lock()

    @classmethod
    def shared(cls, store: Store, max_shards: int = 256) -> IndexCache:
        """This process's cache for ``store`` (kept across epochs: a persistent DataLoader
        worker loads each index once), holding at least ``max_shards`` indexes."""
        caches = _shared_caches.get()
        # The same URL on another endpoint is another dataset: the options are part of the key.
        key = (store.url(""), repr(sorted(store.storage_options.items())))
        cache = caches.get(key)
        if cache is None:
            cache = caches.setdefault(key, cls(store, max_shards))  # threads may race here
        cache._max_shards = max(cache._max_shards, max_shards)
        return cache

    def get(
        self, name: str, num_samples: int | None = None, num_bytes: int | None = None
    ) -> ShardIndex | None:
        """Index ``name`` (offsets: samples then end; key hashes), or None when unusable.

        ``num_samples`` and ``num_bytes`` (the manifest's) are checked against the index, so an
        index of another build is not used.
        """
        with self._lock:
            if name in self._indexes:
                self._indexes.move_to_end(name)
                return self._indexes[name]
        (data,) = read_ranges(self._store, [(name, _read_end(num_samples))])
        return self._keep(name, self._decode(name, data, num_samples, num_bytes))

    def holds(self, name: str) -> bool:
        """Whether index ``name`` is loaded (or known unusable) already."""
        with self._lock:
            return name in self._indexes

    def preload(self, wanted: Sequence[tuple[str, int | None, int | None]]) -> None:
        """Load the indexes ``(name, num_samples, num_bytes)`` not cached yet, all at once
        (on an object store: one request latency for all of them, not one each)."""
        with self._lock:
            known = set(self._indexes)
        missing = {name: (count, size) for name, count, size in wanted if name not in known}
        items = list(missing.items())[: self._max_shards]
        found = read_ranges(self._store, [(name, _read_end(count)) for name, (count, _) in items])
        for (name, (count, size)), data in zip(items, found, strict=True):
            self._keep(name, self._decode(name, data, count, size))

    def _keep(self, name: str, index: ShardIndex | None) -> ShardIndex | None:
        with self._lock:
            self._indexes[name] = index
            while len(self._indexes) > self._max_shards:
                self._indexes.popitem(last=False)
        return index

    def _decode(
        self, name: str, data: bytes | OSError, num_samples: int | None, num_bytes: int | None
    ) -> ShardIndex | None:
        shown = self._store.shown(name)
        try:
            if isinstance(data, OSError):  # StorageError is an OSError too
                raise data
            if (
                num_samples is not None
                and len(data) > _index_end(num_samples)
                and index_version(data) < 3  # a version 3 names its count in its header
            ):
                # More samples than the manifest says (one was read past them): read it
                # whole, so the message names both counts.
                (data,) = read_ranges(self._store, [(name, _index_end(None))])
                if isinstance(data, OSError):
                    raise data
            if len(data) > _MAX_INDEX_BYTES:
                raise ShardFormatError(f"{shown}: larger than {_MAX_INDEX_BYTES} bytes")
            return decode_index(data, shown, num_samples, num_bytes)
        except (OSError, ShardFormatError) as error:
            logger.warning("%s: not using this shard index, walking the shard (%s)", shown, error)
            return None


def _index_end(num_samples: int | None) -> int:
    """The size of a version-2 index of ``num_samples`` (header, offsets and end, key hashes),
    at most the limit+1; 8 bytes more are a version-3 index up to its digests."""
    if num_samples is None:
        return _MAX_INDEX_BYTES + 1
    return min(_MAX_INDEX_BYTES + 1, 16 + 8 * (num_samples + 1) + 8 * num_samples)


def _read_end(num_samples: int | None) -> int:
    """Bytes to read of an index: all of one of ``num_samples`` in one request, and 8 bytes
    more, so an index of more samples than the manifest says is seen (not read cut short)."""
    return min(_MAX_INDEX_BYTES + 1, _index_end(num_samples) + 8)


_shared_caches: ProcessLocal[dict[tuple[str, str], IndexCache]] = ProcessLocal(dict)


class OffsetIndex:
    """Byte offsets of the first samples of recently read shards (least recently used dropped).

    Args:
        max_shards: Shards remembered; memory is about 8 bytes per remembered sample.
    """

    def __init__(self, max_shards: int = 64) -> None:
        self._offsets: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self._max_shards = max_shards

    def get(self, url: str) -> list[int]:
        """Known offsets of samples ``0..len-1`` of ``url`` (a list to extend in place)."""
        offsets = self._offsets.get(url)
        if offsets is None:
            offsets = self._offsets[url] = []
            while len(self._offsets) > self._max_shards:
                self._offsets.popitem(last=False)
        else:
            self._offsets.move_to_end(url)
        return offsets


#: A piece of at most this many bytes is read (or mapped) at once, on its first sample.
SHORT_PIECE_BYTES = 1 << 20
#: Pieces up to this size, of shards not mapped whole, are read into memory instead of mapped
#: alone (a map of its own costs about 10 us).
COPY_MAX_BYTES = 64 << 10


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


def open_piece(
    ranges: Ranges,
    name: str,
    start: int,
    stop: int | None,
    index: OffsetIndex | None = None,
    sample_offsets: Sequence[int] | None = None,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    memory_map: bool = True,
    url: str | None = None,
) -> Iterator[Sample]:
    """Yield samples ``start..stop-1`` of shard ``name`` (to the end when ``stop`` is None).

    Bytes come from ``ranges`` (storage decides how: memory maps and handles kept between
    pieces locally, ranged requests remotely). With ``sample_offsets`` (the shard's index, see
    :class:`~.indexes.IndexCache`) only the piece's bytes are read, and with ``memory_map`` a
    local shard's samples are views of a memory map; without an index, the shard is walked
    from the last offset ``index`` knows. No member larger than ``max_member_bytes`` is read
    into memory. A piece of at most ``SHORT_PIECE_BYTES`` is read or mapped at once and holds
    no file handle (:class:`ShortPiece`). Samples carry the shard's URL (``url``, or the
    store's without credentials) as ``__url__``, and errors name it.

    Raises:
        ShardFormatError: The shard is corrupt, truncated, has fewer than ``stop`` samples, or
            disagrees with its index.

    Examples:
        >>> ranges = Store("shards/train").ranges()  # doctest: +SKIP
        >>> samples = list(open_piece(ranges, "shard-000000.tar", 0, 4))  # doctest: +SKIP
    """
    url = url or ranges.store.shown(name)
    if sample_offsets is not None:  # (returned, not delegated to: one generator less per sample)
        last = len(sample_offsets) - 1
        end = last if stop is None else stop
        if end <= last and 0 < sample_offsets[end] - sample_offsets[start] <= SHORT_PIECE_BYTES:
            return ShortPiece(
                ranges, name, url, start, end, sample_offsets, max_member_bytes, memory_map
            )
        return _read_range(
            ranges, name, url, start, stop, sample_offsets, max_member_bytes, memory_map
        )
    return _walk_piece(ranges, name, url, start, stop, index, max_member_bytes)


def _walk_piece(
    ranges: Ranges,
    name: str,
    url: str,
    start: int,
    stop: int | None,
    index: OffsetIndex | None,
    max_member_bytes: int,
) -> Iterator[Sample]:
    """Samples ``start..stop-1`` found by walking the shard from the last known offset."""
    offsets = index.get(url) if index is not None else []  # by URL: names repeat across stores
    with ranges.lend(name) as stream:
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


def _read_full(
    stream: IO[bytes], url: str, ordinal: int, offsets: Sequence[int], limit: int, previous: str
) -> Sample:
    """:func:`read_full_sample`, whose error names the shard's real size when the index puts
    the sample at or past the shard's end (a truncated shard: the tar reader sees no bytes
    there, and would name the index's offset as where they end)."""
    try:
        return read_full_sample(stream, url, ordinal, offsets, limit, previous)
    except ShardFormatError as error:
        size = _size_of(stream)
        here, after = int(offsets[ordinal]), int(offsets[ordinal + 1])
        if size is None or size > here:  # the reader saw where the bytes end: its error is true
            raise
        raise ShardFormatError(
            f"{url}: the shard is {size:,} bytes, but its index puts sample {ordinal} at bytes "
            f"{here:,}..{after:,} (and the shard's end at byte {int(offsets[-1]):,}); the "
            "shard is truncated, or changed after the build. Re-copy or rebuild it "
            "(`shardstream verify` lists such shards)."
        ) from error


def _size_of(stream: IO[bytes]) -> int | None:
    """The size of the file behind ``stream``, or None when the stream cannot tell."""
    try:
        return os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def _read_range(
    ranges: Ranges,
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
    previous = ""  # the last key read, which errors name
    with ranges.lend(name, begin, end) as stream:
        mapped = ranges.window_maps(stream, offsets, stop) if memory_map else None
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


class ShortPiece(Iterator[Sample]):
    """Samples ``[start, stop)`` of an indexed shard whose bytes fit one read or map.

    Args:
        ranges: Where the shard's bytes come from.
        name: The shard's name in the ranges' store.
        url: The shard's URL for samples and messages (without credentials).
        start: First sample.
        stop: One past the last sample.
        offsets: The shard's index.
        max_member_bytes: Largest sample read by the fast parse (larger: the full reader).
        memory_map: Map local bytes (else read them).
    """

    __slots__ = ("_begin", "_data", "_limit", "_map", "_name", "_next", "_offsets", "_previous",
                 "_ranges", "_stop", "_url")  # fmt: skip

    def __init__(
        self,
        ranges: Ranges,
        name: str,
        url: str,
        start: int,
        stop: int,
        offsets: Sequence[int],
        max_member_bytes: int,
        memory_map: bool,
    ) -> None:
        self._ranges, self._name, self._url = ranges, name, url
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
        data = self._data
        # (A mapped file cut since the piece was mapped: its bytes are read instead.)
        if len(data) and after - here <= self._limit and still_holds(data, after):
            begin = self._begin
            sample = parse_plain_sample(data[here - begin : after - begin], self._url, here)
        if sample is None:  # short, not plain ustar or broken: the full reader says why
            with self._ranges.lend(self._name, here, after) as stream:
                sample = _read_full(
                    stream, self._url, ordinal, self._offsets, self._limit, self._previous
                )
        self._previous = sample["__key__"]
        return sample

    def _load(self) -> memoryview:
        """The piece's bytes (empty when they could not all be read: samples then go through
        the full reader, which reports what is wrong)."""
        begin, end = self._begin, int(self._offsets[self._stop])
        if self._map:
            view = self._ranges.view(self._name, begin, end, alone=end - begin > COPY_MAX_BYTES)
            if view is not None:
                return view
        with self._ranges.lend(self._name, begin, end) as stream:
            buffer = np.empty(end - begin, np.uint8)  # not zeroed: readinto fills it
            if cast(Any, stream).readinto(buffer) == end - begin:
                return memoryview(cast(Any, buffer))
        return memoryview(b"")
