"""A resilient sequential stream over a remote object: retries, resume at offset, read-ahead.

Three small pieces, composed by :func:`shardstream._storage.remote.open_remote`:

- :class:`ExtentFetcher` pulls the object in order from a ``RangeSource`` (one long ranged GET on
  S3), retrying failures and resuming at the exact byte offset already fetched, so a break in
  the middle of a shard neither loses nor repeats a byte.
- :class:`~.readahead.ReadAhead` runs a fetcher in a daemon thread that keeps at most
  ``max_bytes`` of extents queued, so network transfer overlaps the caller's decoding.
- :class:`RemoteStream` is the read-only file object handed to callers (``tarfile`` in stream
  mode, ``read_bytes``...); it counts the bytes it delivered.

Read-ahead for remote streams: a daemon thread that fetches extents ahead of the reader.

Network transfer then overlaps the caller's decoding, with memory bounded by ``max_bytes``."""

from __future__ import annotations

import collections
import io
import logging
import os
import threading
from typing import Any, Protocol

from shardstream._storage.remote.buffers import recycle
from shardstream._storage.remote.retry import Retrier, ShortReadError
from shardstream.errors import StorageError

__all__ = [
    "Extent",
    "ExtentFetcher",
    "ExtentSource",
    "RangeBody",
    "RangeSource",
    "ReadAhead",
    "RemoteStream",
]


logger = logging.getLogger("shardstream.storage")

#: A forward seek up to this far reads and drops the bytes in between (cheaper than a new
#: request's first-byte latency); a longer one starts a new ranged request at the target. Kept
#: short: responses are read whole and connections reused, so a new request costs a round trip.
_SKIP_BY_READING_BYTES = 2**20
#: What sources hand out: ``bytes``, a ``bytearray`` filled in place (no extra copy), or a view
#: of a reused receive buffer (:mod:`shardstream._storage.remote.buffers`).
Extent = bytes | bytearray | memoryview


class RangeBody(Protocol):
    """An open response body: ``read_extent(n)`` returns up to ``n`` bytes, ``b""`` at its end."""

    def read_extent(self, num_bytes: int) -> Extent: ...
    def close(self) -> None: ...


class RangeSource(Protocol):
    """Opens an object's bytes ``[offset, end)`` for sequential reading (one ranged GET).

    A source may learn the object's size from its responses and publish it as ``total_size``
    (S3's ``Content-Range``), which saves a HEAD request per open.
    """

    def open_body(self, offset: int, end: int) -> RangeBody: ...


class ExtentSource(Protocol):
    """Anything that yields an object's bytes in order: ``next_extent()`` is ``None`` at EOF."""

    def next_extent(self) -> Extent | None: ...
    def seek(self, offset: int) -> None: ...
    def close(self) -> None: ...


class ExtentFetcher:
    """Fetches an object in order, retrying and resuming at the offset reached.

    Bytes come from ranged requests whose length starts at ``first_span_bytes`` and doubles up
    to ``max_span_bytes``: a caller that reads only a short piece of a shard wastes little
    transfer, while a whole-shard read quickly settles on a few long requests.

    Args:
        source: Opens bodies for byte ranges.
        size: Bytes to read up to (object size, or the end of the wanted range); ``None`` when
            unknown until the first response tells the source's ``total_size``.
        extent_bytes: Bytes returned per ``next_extent()`` (the last one may be shorter).
        retrier: Counts failures, sleeps between tries, raises when the budget is spent.
        first_span_bytes: Length of the first ranged request after an open or a seek.
        max_span_bytes: Longest ranged request.
        start: Offset of the first byte fetched.
        limit: Never fetch at or past this offset (the end of a ranged read), or ``None``.

    Attributes:
        next_span_bytes: Length of the next ranged request (set it to start an open smaller).
    """

    def __init__(
        self,
        source: RangeSource,
        size: int | None,
        extent_bytes: int,
        retrier: Retrier,
        first_span_bytes: int = 2**20,
        max_span_bytes: int = 64 * 2**20,
        start: int = 0,
        limit: int | None = None,
    ) -> None:
        self.source, self.size, self.retrier = source, size, retrier
        self.extent_bytes = extent_bytes
        self.first_span_bytes, self.max_span_bytes = first_span_bytes, max_span_bytes
        self.limit = limit
        self.offset = start
        self.next_span_bytes = first_span_bytes
        self._body: RangeBody | None = None
        self._body_end = 0

    def seek(self, offset: int) -> None:
        """Continue from ``offset`` (drops the open response)."""
        self._close_body()
        self.offset = max(0, offset if self.size is None else min(offset, self.size))
        self.next_span_bytes = self.first_span_bytes

    def _open_body(self) -> RangeBody:
        end = self.offset + self.next_span_bytes
        if self.size is not None:
            end = min(self.size, end)
        body = self.source.open_body(self.offset, end)
        total = getattr(self.source, "total_size", None)
        if total is not None:  # learnt from the response: the object may be shorter than asked
            self.size = total if self.limit is None else min(total, self.limit)
            end = min(end, self.size)
        self._body, self._body_end = body, end
        # Double, but never below first_span_bytes: a short opening peek is not a read pattern.
        doubled = max(2 * self.next_span_bytes, self.first_span_bytes)
        self.next_span_bytes = min(self.max_span_bytes, doubled)
        return body

    def next_extent(self) -> Extent | None:
        """The next extent of the object, or ``None`` at its end (or once stopped)."""
        while self.size is None or self.offset < self.size:
            if self.retrier.stop.is_set():
                return None
            try:
                body = self._body or self._open_body()
                if self.offset >= self._body_end:  # the object ends before the wanted range
                    self._close_body()
                    return None
                extent = body.read_extent(min(self.extent_bytes, self._body_end - self.offset))
                if not extent:
                    raise ShortReadError(
                        f"response body ended at byte {self.offset}, expected bytes up to "
                        f"{self._body_end}"
                    )
            except Exception as exc:  # classified by the retrier: retry, or raise clearly
                self._close_body()
                self.retrier.failed(exc, self.offset, self.size)
                continue
            self.retrier.succeeded()
            self.offset += len(extent)
            if self.offset >= self._body_end:
                self._close_body()
            return extent
        self._close_body()
        return None

    def _close_body(self) -> None:
        body, self._body = self._body, None
        if body is not None:
            try:
                body.close()
            except Exception as exc:  # a broken connection may fail to close; nothing to do
                logger.debug("closing a response body failed: %r", exc)

    def close(self) -> None:
        """Drop the open response, if any."""
        self.retrier.stop.set()
        self._close_body()


class RemoteStream(io.RawIOBase):
    """Read-only, non-seekable file object over a :class:`ExtentSource`.

    ``read(n)`` returns exactly ``n`` bytes unless the object ends first, like a buffered
    file, so ``tarfile.open(fileobj=..., mode="r|*")`` and ``read()`` both work.

    Attributes:
        url: The object (redacted), for messages.
        size: Object size in bytes (the end of the range, for a ranged read).
    """

    def __init__(
        self, extents: ExtentSource, url: str, size: int, start: int = 0, head: Extent = b""
    ) -> None:
        super().__init__()
        self._extents, self.url, self.size = extents, url, size
        self._extent: Extent | None = head  # the extent being read (handed back once read)
        self._current = memoryview(head)  # its bytes not read yet (first: the opening GET's)
        self._offset = start
        self._eof = False
        self._pid = os.getpid()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        """The offset of the next byte :meth:`read` returns."""
        return self._offset

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        """Move to a byte offset; short forward hops read on, longer jumps start a new request."""
        if self.closed:
            raise ValueError(f"{self.url}: seek on a closed stream")
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._offset, io.SEEK_END: self.size}[whence]
        target = min(base + offset, self.size)
        if target < 0:
            raise ValueError(f"{self.url}: cannot seek to negative offset {target}")
        distance = target - self._offset
        if 0 <= distance <= max(len(self._current), _SKIP_BY_READING_BYTES):
            while distance > 0:
                skipped = len(self.read(min(distance, 2**20)))
                if not skipped:
                    break
                distance -= skipped
            return self._offset
        self._extents.seek(target)
        self._drop_extent()
        self._offset, self._eof = target, False
        return target

    @property
    def extent_source(self) -> ExtentSource:
        """Where the extents come from: a ``ReadAhead`` when reading ahead (for tests, stats)."""
        return self._extents

    def _fill(self) -> bool:
        if self._eof:
            return False
        if os.getpid() != self._pid:
            raise StorageError(
                f"{self.url}: a stream opened in process {self._pid} was read in process "
                f"{os.getpid()}. Open shards inside each DataLoader worker, not before forking."
            )
        self._drop_extent()
        extent = self._extents.next_extent()
        if extent is None:
            self._eof = True
            return False
        self._extent, self._current = extent, memoryview(extent)
        return True

    def _drop_extent(self) -> None:
        """Forget the current extent and give its receive buffer back: this stream is its one
        reader, and hands out copies of its bytes (``read``, ``readinto``), never a view."""
        self._current.release()
        self._current = memoryview(b"")
        recycle(self._take_extent())

    def _take_extent(self) -> Extent | None:
        extent, self._extent = self._extent, None
        return extent

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError(f"{self.url}: read from a closed stream")
        target = memoryview(buffer).cast("B")
        filled = 0
        while filled < len(target):
            if not self._current and not self._fill():
                break
            count = min(len(target) - filled, len(self._current))
            target[filled : filled + count] = self._current[:count]
            self._current = self._current[count:]
            filled += count
        self._offset += filled
        return filled

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            return self.readall()
        if self.closed:
            raise ValueError(f"{self.url}: read from a closed stream")
        parts: list[bytes] = []
        wanted = size
        while wanted > 0 and (self._current or self._fill()):
            parts.append(self._current[:wanted].tobytes())  # a copy: see _drop_extent
            self._current = self._current[len(parts[-1]) :]
            wanted -= len(parts[-1])
        data = b"".join(parts)
        self._offset += len(data)
        return data

    def readall(self) -> bytes:
        parts: list[bytes] = []
        while True:
            data = self.read(8 * 2**20)
            if not data:
                return b"".join(parts)
            parts.append(data)

    def close(self) -> None:
        if not self.closed:
            self._extents.close()
            self._drop_extent()
        super().close()


class ReadAhead:
    """Runs a :class:`ExtentSource` in a daemon thread, keeping at most ``max_bytes`` queued.

    The first extent after an open or a seek is fetched in the caller's thread (it is waited
    for anyway, and a caller that peeks and then seeks should not trigger a prefetch); the
    thread starts on the second ``next_extent()``. Its window starts at one extent (so only
    the next extent is fetched ahead) and grows by what the caller consumes, up to
    ``max_bytes``: a stream opened for a short piece of a shard fetches little it will not use,
    and a whole-shard stream soon prefetches the full amount. A seek starts the window afresh.
    Errors raised by the source are re-raised to the caller of :meth:`next_extent`.
    """

    def __init__(
        self, source: ExtentSource, max_bytes: int, extent_bytes: int, stop: threading.Event
    ) -> None:
        self._source, self._max_bytes, self._extent_bytes = source, max_bytes, extent_bytes
        self._stop = stop
        self._extents: collections.deque[Extent] = collections.deque()
        self.buffered_bytes = 0
        self.window_bytes = min(max_bytes, extent_bytes)
        self._done = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._fetched_first = False

    def _has_room(self) -> bool:
        return self.buffered_bytes == 0 or (
            self.buffered_bytes + self._extent_bytes <= self.window_bytes
        )

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop.is_set() and not self._has_room():
                        self._cond.wait()
                    if self._stop.is_set():
                        return
                extent = self._source.next_extent()
                with self._cond:
                    if extent is None or self._stop.is_set():
                        return
                    self._extents.append(extent)
                    self.buffered_bytes += len(extent)
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the reading thread, which raises it
            with self._cond:
                self._error = exc
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()

    def next_extent(self) -> Extent | None:
        """The next extent (blocking until fetched), or ``None`` at the end of the object."""
        if not self._fetched_first and self._thread is None and not self._stop.is_set():
            self._fetched_first = True
            return self._source.next_extent()
        with self._cond:
            if self._thread is None and not self._stop.is_set():
                self._thread = threading.Thread(
                    target=self._run, name="shardstream-read-ahead", daemon=True
                )
                self._thread.start()
            while not self._extents and not self._done:
                self._cond.wait()
            if self._extents:
                extent = self._extents.popleft()
                self.buffered_bytes -= len(extent)
                self.window_bytes = min(self._max_bytes, self.window_bytes + len(extent))
                self._cond.notify_all()
                return extent
            if self._error is not None:
                raise self._error
            return None

    def _halt(self, join_timeout_s: float) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(join_timeout_s)
        with self._cond:  # after the join: the thread may have queued one last extent
            self._extents.clear()
            self.buffered_bytes = 0

    def seek(self, offset: int) -> None:
        """Drop what was prefetched and continue from ``offset`` with the initial window."""
        self._halt(join_timeout_s=60.0)
        self.window_bytes = min(self._max_bytes, self._extent_bytes)
        self._fetched_first = False
        self._stop.clear()
        self._done, self._error = False, None
        self._source.seek(offset)

    def close(self, join_timeout_s: float = 5.0) -> None:
        """Stop the thread, drop queued extents and the open response."""
        self._halt(join_timeout_s)
        self._source.close()

    @property
    def alive(self) -> bool:
        """True while the background thread runs."""
        return self._thread is not None and self._thread.is_alive()
