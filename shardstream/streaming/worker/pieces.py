"""Reading one piece (samples ``[start, stop)`` of one shard) by byte range.

A worker reads many short pieces, several from the same shard. When the shard has a byte-offset
index (``shard-NNNNNN.idx``, written by the shardstream writer), the worker loads it once into a
small :class:`IndexCache` and reads exactly the bytes ``[offsets[start], offsets[stop])``: one
ranged GET per piece on S3, no walk over the members before it. Shards without an index (made
by other tools) are walked from byte 0, and each walk records the offsets it passes in a bounded
:class:`OffsetIndex`, so later pieces of that shard start closer. A :class:`HandlePool` keeps
recently used local shard files open, so a piece costs a seek rather than an open (remote
streams are never reused: their read-ahead is positional).
"""

from __future__ import annotations

import array
import collections
import contextlib
import logging
from collections.abc import Iterator, Sequence
from typing import IO

from shardstream.errors import ShardFormatError
from shardstream.format.samples import iter_samples
from shardstream.format.shardindex import decode_offsets
from shardstream.format.tarfast import SampleMap, parse_plain_sample, read_plain_sample
from shardstream.format.tarreader import DEFAULT_MAX_MEMBER_BYTES, Sample, TarReader, open_tar
from shardstream.storage import Store, is_local_url

__all__ = ["HandlePool", "IndexCache", "OffsetIndex", "read_piece"]

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

    Example:
        >>> cache = IndexCache(Store("shards/train"))  # doctest: +SKIP
        >>> offsets = cache.get("shard-000000.idx")  # doctest: +SKIP
    """

    def __init__(self, store: Store, max_shards: int = 256) -> None:
        self._store = store
        self._max_shards = max_shards
        self._indexes: collections.OrderedDict[str, array.array[int] | None] = (
            collections.OrderedDict()
        )

    def get(
        self, name: str, num_samples: int | None = None, num_bytes: int | None = None
    ) -> array.array[int] | None:
        """The offsets in index ``name`` (samples then end), or None when it cannot be used.

        ``num_samples`` and ``num_bytes`` (the manifest's) are checked against the index, so an
        index of another build is not used.
        """
        if name in self._indexes:
            self._indexes.move_to_end(name)
            return self._indexes[name]
        offsets = self._load(name, num_samples, num_bytes)
        self._indexes[name] = offsets
        while len(self._indexes) > self._max_shards:
            self._indexes.popitem(last=False)
        return offsets

    def _load(
        self, name: str, num_samples: int | None, num_bytes: int | None
    ) -> array.array[int] | None:
        shown = self._store.shown(name)
        try:
            with self._store.open_read(name) as stream:
                data = stream.read(_MAX_INDEX_BYTES + 1)
            if len(data) > _MAX_INDEX_BYTES:
                raise ShardFormatError(f"{shown}: larger than {_MAX_INDEX_BYTES} bytes")
            return decode_offsets(data, shown, num_samples, num_bytes)
        except (OSError, ShardFormatError) as error:  # StorageError is an OSError too
            logger.warning("%s: not using this shard index, walking the shard (%s)", shown, error)
            return None


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


class HandlePool:
    """Idle open handles of local shard files, reused by later pieces (least recently used closed).

    A handle is lent to one piece at a time, so pieces of one shard read at once never share a
    file position. Call :meth:`close` when the epoch ends (the worker does, also on errors).

    Args:
        store: Where the shards are; remote streams are opened per piece, never kept.
        max_idle: Idle handles kept open; each costs one file descriptor.

    Example:
        >>> pool = HandlePool(Store("shards/train"))  # doctest: +SKIP
        >>> with pool.lend("shard-000000.tar") as stream: ...  # doctest: +SKIP
        >>> pool.close()  # doctest: +SKIP
    """

    def __init__(self, store: Store, max_idle: int = 64) -> None:
        self.store = store
        self._max_idle = max_idle
        self._idle: collections.OrderedDict[int, tuple[str, IO[bytes]]] = collections.OrderedDict()
        self._closed = False

    @property
    def num_idle(self) -> int:
        """Handles currently kept open while unused."""
        return len(self._idle)

    @contextlib.contextmanager
    def lend(self, name: str, start: int = 0, end: int | None = None) -> Iterator[IO[bytes]]:
        """Yield a handle of ``name`` positioned at ``start``; give it back (or close it) after.

        A remote handle reads only bytes ``[start, end)``; a local one is a plain file (the
        caller stops at ``end``), so it can be lent again for another range.
        """
        local = is_local_url(self.store.url(name))
        stream = self._take(name, start) if local else self.store.open_read(name, start, end)
        reusable = False
        try:
            yield stream
            reusable = not self._closed and local
        finally:
            if reusable:
                self._give_back(name, stream)
            else:
                stream.close()

    def _take(self, name: str, start: int) -> IO[bytes]:
        for slot, (idle_name, stream) in reversed(self._idle.items()):
            if idle_name == name:
                del self._idle[slot]
                stream.seek(start)
                return stream
        stream = self.store.open_read(name)
        if start:
            stream.seek(start)
        return stream

    def _give_back(self, name: str, stream: IO[bytes]) -> None:
        self._idle[id(stream)] = (name, stream)
        while len(self._idle) > self._max_idle:
            _, (_, oldest) = self._idle.popitem(last=False)
            oldest.close()

    def close(self) -> None:
        """Close every idle handle; handles still lent are closed when given back."""
        self._closed = True
        while self._idle:
            _, (_, stream) = self._idle.popitem(last=False)
            stream.close()


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
                stream.seek(here)
                reader = TarReader(stream, url, True, here, after, None, limit)
                reader.last_key = previous
                found = list(iter_samples(reader))
                if len(found) != 1 or found[0][1] != here:
                    raise _index_mismatch(url, ordinal, offsets, found)
                sample = found[0][0]
            previous = sample["__key__"]
            yield sample


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
