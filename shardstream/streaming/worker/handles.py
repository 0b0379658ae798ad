"""What a worker keeps open between pieces: shard indexes, walked offsets, local file handles.

A worker reads many short pieces, several from the same shard. When the shard has a byte-offset
index (``shard-NNNNNN.idx``), the worker loads it once into a small :class:`IndexCache`.
Shards without an index (made by other tools, not yet indexed) are walked from byte 0, and each
walk records the offsets it passes in a bounded :class:`OffsetIndex`, so later pieces of that
shard start closer. A :class:`HandlePool` keeps recently used local shard files open, so a piece
costs a seek rather than an open, and a memory-mapped piece not even that (remote streams are
never reused: their read-ahead is positional).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import weakref
from collections.abc import Iterator, Sequence
from typing import IO

from shardstream.errors import ShardFormatError, ShardNotFoundError
from shardstream.format.filemaps import DEFAULT_MAP_CACHE_BYTES, FileMaps, map_range
from shardstream.format.shardindex import ShardIndex, decode_index
from shardstream.storage import Store, is_local_url
from shardstream.storage.batchread import read_ranges
from shardstream.storage.processlocal import ProcessLocal

__all__ = ["HandlePool", "IndexCache", "OffsetIndex"]

logger = logging.getLogger("shardstream.streaming")

#: An idle handle: (shard, handle, file length or -1 when not asked yet).
_Idle = tuple[str, IO[bytes], int]
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
        self._indexes: collections.OrderedDict[str, ShardIndex | None] = collections.OrderedDict()

    @classmethod
    def shared(cls, store: Store, max_shards: int = 256) -> IndexCache:
        """This process's cache for ``store`` (kept across epochs: a persistent DataLoader
        worker loads each index once), holding at least ``max_shards`` indexes."""
        caches = _shared_caches.get()
        # The same URL on another endpoint is another dataset: the options are part of the key.
        key = (store.url(""), repr(sorted(store.storage_options.items())))
        cache = caches.get(key)
        if cache is None:
            cache = caches[key] = cls(store, max_shards)
        cache._max_shards = max(cache._max_shards, max_shards)
        return cache

    def get(
        self, name: str, num_samples: int | None = None, num_bytes: int | None = None
    ) -> ShardIndex | None:
        """Index ``name`` (offsets: samples then end; key hashes), or None when unusable.

        ``num_samples`` and ``num_bytes`` (the manifest's) are checked against the index, so an
        index of another build is not used.
        """
        if name in self._indexes:
            self._indexes.move_to_end(name)
            return self._indexes[name]
        (data,) = read_ranges(self._store, [(name, _read_end(num_samples))])
        return self._keep(name, self._decode(name, data, num_samples, num_bytes))

    def preload(self, wanted: Sequence[tuple[str, int | None, int | None]]) -> None:
        """Load the indexes ``(name, num_samples, num_bytes)`` not cached yet, all at once
        (on an object store: one request latency for all of them, not one each)."""
        missing = {name: (count, size) for name, count, size in wanted if name not in self._indexes}
        items = list(missing.items())[: self._max_shards]
        found = read_ranges(self._store, [(name, _read_end(count)) for name, (count, _) in items])
        for (name, (count, size)), data in zip(items, found, strict=True):
            self._keep(name, self._decode(name, data, count, size))

    def _keep(self, name: str, index: ShardIndex | None) -> ShardIndex | None:
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
            if num_samples is not None and len(data) > _index_end(num_samples):
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
    at most the limit+1."""
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


class HandlePool:
    """Idle open handles of local shard files, reused by later pieces (least recently used closed).

    A handle is lent to one piece at a time, so pieces of one shard read at once never share a
    file position. Call :meth:`close` when the epoch ends (the worker does, also on errors).

    Args:
        store: Where the shards are; remote streams are opened per piece, never kept.
        max_idle: Idle handles kept open; each costs one file descriptor.
        max_map_bytes: Bytes of local shard files kept mapped whole until :meth:`close` (see
            :meth:`map`).

    Example:
        >>> pool = HandlePool(Store("shards/train"))  # doctest: +SKIP
        >>> with pool.lend("shard-000000.tar") as stream: ...  # doctest: +SKIP
        >>> pool.close()  # doctest: +SKIP
    """

    def __init__(
        self, store: Store, max_idle: int = 64, max_map_bytes: int = DEFAULT_MAP_CACHE_BYTES
    ) -> None:
        self.store = store
        self._max_idle = max_idle
        self._idle: collections.OrderedDict[int, _Idle] = collections.OrderedDict()
        self._by_name: dict[str, list[int]] = {}  # idle handles of each shard, newest last
        self._local: dict[str, bool] = {}
        self._maps = FileMaps(max_map_bytes)
        self._closed = False
        # A pool dropped without close() (a dataset's reader kept for the process's life)
        # still closes its idle files.
        weakref.finalize(self, _close_idle, self._idle)

    def is_local(self, name: str) -> bool:
        """Whether ``name`` is a local file (asked per piece: remembered per shard)."""
        local = self._local.get(name)
        if local is None:
            if len(self._local) >= 65536:
                self._local.clear()
            local = self._local[name] = is_local_url(self.store.url(name))
        return local

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
        if not self.is_local(name):
            remote = self._open(name, start, end)
            try:
                yield remote
            finally:
                remote.close()
            return
        stream, length = self._take(name)
        given = False
        try:
            stream.seek(start)
            yield stream
            given = True
        finally:
            self._release(name, stream, length, reusable=given)

    def map(self, name: str, begin: int, end: int, alone: bool = True) -> memoryview | None:
        """Bytes ``[begin, end)`` of local shard ``name`` as a view of a memory map, or None.

        The shard is mapped whole on its first piece and kept until the pool closes (see
        :mod:`shardstream.format.filemaps`): later pieces cost a lookup and a slice. A shard
        larger than the map budget, or met when the process is out of maps, has each piece
        mapped alone (unless ``alone`` is False: a short piece is cheaper to read). None when
        ``name`` is not a local file, the file is shorter than ``end`` (a map past the end of
        a file faults), or no map can be made: read the bytes then.
        """
        mapped = self._maps.get(name)
        if mapped is None:
            if not self.is_local(name):
                return None
            stream, length = self._take(name)
            try:
                length = length if length >= 0 else _file_length(stream)
                mapped = None if self._closed else self._maps.open(name, stream.fileno(), length)
                if mapped is None:
                    mappable = alone and length >= end
                    return map_range(stream.fileno(), begin, end) if mappable else None
            finally:
                self._release(name, stream, length)
        return mapped.piece(begin, end) if mapped.size >= end else None

    def _take(self, name: str) -> tuple[IO[bytes], int]:
        """An idle handle of ``name`` (a new one if none) and its length (-1: not asked)."""
        slots = self._by_name.get(name)
        if not slots:
            return self._open(name), -1
        slot = slots.pop()
        if not slots:
            del self._by_name[name]
        _, stream, length = self._idle.pop(slot)
        return stream, length

    def _open(self, name: str, start: int = 0, end: int | None = None) -> IO[bytes]:
        try:
            return self.store.open_read(name, start, end)
        except FileNotFoundError as error:
            raise ShardNotFoundError(
                f"{self.store.shown(name)}: shard not found; check that the source names "
                "existing shards (the folder, the pattern, the .txt list's entries), or pass "
                "on_error='skip' to skip and count its samples"
            ) from error

    def _release(self, name: str, stream: IO[bytes], length: int, reusable: bool = True) -> None:
        """Keep ``stream`` for later pieces, or close it (the pool is closed, or it failed)."""
        if reusable and not self._closed:
            self._give_back(name, stream, length)
        else:
            stream.close()

    def _give_back(self, name: str, stream: IO[bytes], length: int) -> None:
        self._idle[id(stream)] = (name, stream, length)
        self._by_name.setdefault(name, []).append(id(stream))
        while len(self._idle) > self._max_idle:
            slot, (oldest_name, oldest, _) = self._idle.popitem(last=False)
            slots = self._by_name[oldest_name]
            slots.remove(slot)
            if not slots:
                del self._by_name[oldest_name]
            oldest.close()

    def close(self) -> None:
        """Close every idle handle and drop the shards' maps; handles still lent are closed
        when given back."""
        self._closed = True
        self._by_name.clear()
        self._maps.clear()  # each map goes once no sample views it
        _close_idle(self._idle)


def _file_length(stream: IO[bytes]) -> int:
    """The length of an open local file (0 when it has no descriptor to ask)."""
    try:
        return os.fstat(stream.fileno()).st_size
    except (OSError, ValueError):  # no descriptor (io.UnsupportedOperation is both)
        return 0


def _close_idle(idle: collections.OrderedDict[int, _Idle]) -> None:
    while idle:
        _, (_, stream, _) = idle.popitem(last=False)
        stream.close()
