"""A reader's local files: handles kept open between pieces, and whole-file memory maps.

:class:`LocalRanges` is what the local backend lends a streaming worker (see
:mod:`shardstream.storage.ranges`); the shard cache's reader
(:class:`~shardstream.storage.backends.cached.CachedRanges`) refines it for remote shards kept
whole on local disk.
"""

from __future__ import annotations

import collections
import contextlib
import os
import weakref
from collections.abc import Iterator, Sequence
from typing import IO

from shardstream.storage.backends.localmaps import FileMaps, WindowMaps, map_range
from shardstream.storage.ranges import Ranges, StoreLike

__all__ = ["LocalRanges"]

#: An idle handle: (file name, handle, file length or -1 when not asked yet).
_Idle = tuple[str, IO[bytes], int]


class LocalRanges(Ranges):
    """A reader's local files: idle handles reused by later pieces, and whole-file maps.

    A handle is lent to one piece at a time, so pieces of one file read at once never share a
    file position. Call :meth:`close` when the pass ends (the worker does, also on errors).

    Args:
        store: Where the files are.
        max_idle: Idle handles kept open; each costs one file descriptor.
        max_map_bytes: Bytes of files kept mapped whole until :meth:`close` (see :meth:`view`).
    """

    announces = False

    def __init__(self, store: StoreLike, max_idle: int = 64, max_map_bytes: int = 2 << 30) -> None:
        super().__init__(store)
        self._max_idle = max_idle
        self._idle: collections.OrderedDict[int, _Idle] = collections.OrderedDict()
        self._by_name: dict[str, list[int]] = {}  # idle handles of each file, newest last
        self._maps = FileMaps(max_map_bytes)
        self._closed = False
        # Ranges dropped without close() (a dataset's reader kept for the process's life)
        # still close their idle files.
        weakref.finalize(self, _close_idle, self._idle)

    @property
    def num_idle(self) -> int:
        """Handles currently kept open while unused."""
        return len(self._idle)

    @contextlib.contextmanager
    def lend(self, name: str, start: int = 0, end: int | None = None) -> Iterator[IO[bytes]]:
        """A plain file positioned at ``start`` (the caller stops at ``end``), so it can be
        lent again for another range once given back."""
        stream, length = self._take(name)
        given = False
        try:
            stream.seek(start)
            yield stream
            given = True
        finally:
            self._release(name, stream, length, reusable=given)

    def view(self, name: str, begin: int, end: int, alone: bool = True) -> memoryview | None:
        """Bytes ``[begin, end)`` as a slice of the file's map, made whole on its first range
        and kept until :meth:`close` (later ranges cost a lookup and a slice). A file larger
        than the map budget, or met when the process is out of maps, has the range mapped
        alone (unless ``alone`` is False: a short range is cheaper to read). None when the
        file is shorter than ``end`` (a map past the end of a file faults) or no map can be
        made: read the bytes then."""
        mapped = self._maps.get(name)
        if mapped is None:
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

    def window_maps(
        self, stream: IO[bytes], boundaries: Sequence[int], stop: int
    ) -> WindowMaps | None:
        """Windows of ``stream``'s ranges ``[boundaries[i], boundaries[i + 1])`` mapped a few
        at a time (see :class:`~.localmaps.WindowMaps`)."""
        return WindowMaps(stream, boundaries, stop)

    def _take(self, name: str) -> tuple[IO[bytes], int]:
        """An idle handle of ``name`` (a new one if none) and its length (-1: not asked)."""
        slots = self._by_name.get(name)
        if not slots:
            return self.open_range(name), -1
        slot = slots.pop()
        if not slots:
            del self._by_name[name]
        _, stream, length = self._idle.pop(slot)
        return stream, length

    def _release(self, name: str, stream: IO[bytes], length: int, reusable: bool = True) -> None:
        """Keep ``stream`` for later pieces, or close it (the ranges are closed, or it failed)."""
        if not reusable or self._closed:
            stream.close()
            return
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
        """Close every idle handle and drop the maps; handles still lent are closed when given
        back, and each map goes once no sample views it."""
        self._closed = True
        self._by_name.clear()
        self._maps.clear()
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
