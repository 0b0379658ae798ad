"""Reading one piece (samples ``[start, stop)`` of one shard) with a small offset index.

A worker reads many short pieces, several from the same shard. Each open records the byte offset
of every sample it passes in a bounded per-process index, so the next piece of that shard seeks
straight to its first sample instead of hopping over the members before it. A
:class:`HandlePool` keeps recently used local shard files open, so a piece costs a seek rather
than an open (remote streams are never reused: their read-ahead is positional).
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Iterator
from typing import IO

from shardstream import _fs
from shardstream.errors import ShardFormatError
from shardstream.streaming.tario import Sample, TarReader, iter_samples, open_tar

__all__ = ["HandlePool", "OffsetIndex", "read_piece"]

Opener = Callable[[str], IO[bytes]]


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
        opener: Opens a URL for binary reading.
        max_idle: Idle handles kept open; each costs one file descriptor.

    Example:
        >>> pool = HandlePool(open)  # doctest: +SKIP
        >>> with pool.lend("shard-000000.tar") as stream: ...  # doctest: +SKIP
        >>> pool.close()  # doctest: +SKIP
    """

    def __init__(self, opener: Opener, max_idle: int = 64) -> None:
        self._opener = opener
        self._max_idle = max_idle
        self._idle: collections.OrderedDict[int, tuple[str, IO[bytes]]] = collections.OrderedDict()
        self._closed = False

    @property
    def num_idle(self) -> int:
        """Handles currently kept open while unused."""
        return len(self._idle)

    @contextlib.contextmanager
    def lend(self, url: str) -> Iterator[IO[bytes]]:
        """Yield a handle of ``url`` positioned at byte 0; give it back (or close it) after."""
        stream = self._take(url)
        reusable = False
        try:
            yield stream
            reusable = not self._closed and _fs.is_local(url)
        finally:
            if reusable:
                self._give_back(url, stream)
            else:
                stream.close()

    def _take(self, url: str) -> IO[bytes]:
        for slot, (idle_url, stream) in reversed(self._idle.items()):
            if idle_url == url:
                del self._idle[slot]
                stream.seek(0)
                return stream
        return self._opener(url)

    def _give_back(self, url: str, stream: IO[bytes]) -> None:
        self._idle[id(stream)] = (url, stream)
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
    url: str, start: int, stop: int | None, opener: Opener, index: OffsetIndex | None = None
) -> Iterator[Sample]:
    """Yield samples ``start..stop-1`` of the shard at ``url`` (to the end when ``stop`` is None).

    ``opener`` may be :meth:`HandlePool.lend` to reuse open local files across pieces.

    Raises:
        ShardFormatError: The shard is corrupt, truncated, or has fewer than ``stop`` samples.

    Example:
        >>> samples = list(read_piece("shard-000000.tar", 0, 4, open))  # doctest: +SKIP
    """
    offsets = index.get(url) if index is not None else []
    with opener(url) as stream:
        reader = open_tar(stream, url)
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
