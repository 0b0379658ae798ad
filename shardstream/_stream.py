"""A resilient sequential stream over a remote object: retries, resume at offset, read-ahead.

Three small pieces, composed by :func:`shardstream._remote.open_remote`:

- :class:`ChunkFetcher` pulls the object in order from a ``RangeSource`` (one long ranged GET on
  S3), retrying failures and resuming at the exact byte offset already fetched, so a break in
  the middle of a shard neither loses nor repeats a byte.
- :class:`ReadAhead` runs a fetcher in a daemon thread that keeps at most ``max_bytes`` of
  chunks queued, so network transfer overlaps the caller's decoding.
- :class:`RemoteStream` is the read-only file object handed to callers (``tarfile`` in stream
  mode, ``read_bytes``...); it counts the bytes it delivered.
"""

from __future__ import annotations

import collections
import io
import logging
import os
import threading
from typing import Any, Protocol

from shardstream._retry import Retrier, ShortReadError
from shardstream.errors import StorageError

__all__ = ["ChunkFetcher", "ChunkSource", "RangeBody", "RangeSource", "ReadAhead", "RemoteStream"]

logger = logging.getLogger("shardstream.storage")


class RangeBody(Protocol):
    """An open response body: ``read_chunk(n)`` returns up to ``n`` bytes, ``b""`` at its end."""

    def read_chunk(self, num_bytes: int) -> bytes: ...
    def close(self) -> None: ...


class RangeSource(Protocol):
    """Opens an object's bytes ``[offset, size)`` for sequential reading."""

    def open_body(self, offset: int, size: int) -> RangeBody: ...


class ChunkSource(Protocol):
    """Anything that yields an object's bytes in order: ``next_chunk()`` is ``None`` at EOF."""

    def next_chunk(self) -> bytes | None: ...
    def close(self) -> None: ...


class ChunkFetcher:
    """Fetches ``size`` bytes in order, retrying and resuming at the offset reached.

    Args:
        source: Opens bodies at a byte offset.
        size: Object size in bytes (from a HEAD request).
        chunk_bytes: Bytes returned per ``next_chunk()`` (the last one may be shorter).
        retrier: Counts failures, sleeps between tries, raises when the budget is spent.
    """

    def __init__(self, source: RangeSource, size: int, chunk_bytes: int, retrier: Retrier):
        self.source, self.size, self.chunk_bytes, self.retrier = source, size, chunk_bytes, retrier
        self.offset = 0
        self._body: RangeBody | None = None

    def next_chunk(self) -> bytes | None:
        """The next chunk of the object, or ``None`` once all ``size`` bytes were returned."""
        while self.offset < self.size:
            if self.retrier.stop.is_set():
                return None
            wanted = min(self.chunk_bytes, self.size - self.offset)
            try:
                if self._body is None:
                    self._body = self.source.open_body(self.offset, self.size)
                chunk = self._body.read_chunk(wanted)
                if not chunk:
                    raise ShortReadError(
                        f"response body ended at byte {self.offset}, expected {self.size} bytes"
                    )
            except Exception as exc:  # classified by the retrier: retry, or raise clearly
                self._close_body()
                self.retrier.failed(exc, self.offset, self.size)
                continue
            self.retrier.succeeded()
            self.offset += len(chunk)
            return chunk
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


class ReadAhead:
    """Runs a :class:`ChunkSource` in a daemon thread, keeping at most ``max_bytes`` queued.

    Errors raised by the source are re-raised to the caller of :meth:`next_chunk`. ``close()``
    stops the thread; it never blocks longer than ``join_timeout_s``.
    """

    def __init__(
        self, source: ChunkSource, max_bytes: int, chunk_bytes: int, stop: threading.Event
    ) -> None:
        self._source, self._max_bytes, self._chunk_bytes = source, max_bytes, chunk_bytes
        self._stop = stop
        self._chunks: collections.deque[bytes] = collections.deque()
        self.buffered_bytes = 0
        self._done = False
        self._error: BaseException | None = None
        self._cond = threading.Condition()
        self._thread = threading.Thread(
            target=self._run, name="shardstream-read-ahead", daemon=True
        )
        self._thread.start()

    def _has_room(self) -> bool:
        return (
            self.buffered_bytes == 0 or self.buffered_bytes + self._chunk_bytes <= self._max_bytes
        )

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    while not self._stop.is_set() and not self._has_room():
                        self._cond.wait()
                    if self._stop.is_set():
                        return
                chunk = self._source.next_chunk()
                with self._cond:
                    if chunk is None:
                        self._done = True
                        return
                    self._chunks.append(chunk)
                    self.buffered_bytes += len(chunk)
                    self._cond.notify_all()
        except BaseException as exc:  # handed to the reading thread, which raises it
            with self._cond:
                self._error = exc
        finally:
            with self._cond:
                self._done = True
                self._cond.notify_all()
            self._source.close()

    def next_chunk(self) -> bytes | None:
        """The next chunk (blocking until fetched), or ``None`` at the end of the object."""
        with self._cond:
            while not self._chunks and not self._done:
                self._cond.wait()
            if self._chunks:
                chunk = self._chunks.popleft()
                self.buffered_bytes -= len(chunk)
                self._cond.notify_all()
                return chunk
            if self._error is not None:
                raise self._error
            return None

    def close(self, join_timeout_s: float = 5.0) -> None:
        """Stop the thread and drop queued chunks."""
        self._stop.set()
        with self._cond:
            self._chunks.clear()
            self.buffered_bytes = 0
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(join_timeout_s)

    @property
    def alive(self) -> bool:
        """True while the background thread runs."""
        return self._thread.is_alive()


class RemoteStream(io.RawIOBase):
    """Read-only, non-seekable file object over a :class:`ChunkSource`.

    ``read(n)`` returns exactly ``n`` bytes unless the object ends first, like a buffered
    file, so ``tarfile.open(fileobj=..., mode="r|*")`` and ``read()`` both work.

    Attributes:
        url: The object (redacted), for messages.
        size: Object size in bytes.
    """

    def __init__(self, chunks: ChunkSource, url: str, size: int) -> None:
        super().__init__()
        self._chunks, self.url, self.size = chunks, url, size
        self._current = memoryview(b"")
        self._offset = 0
        self._eof = False
        self._pid = os.getpid()

    def readable(self) -> bool:
        return True

    def tell(self) -> int:
        """Bytes delivered so far."""
        return self._offset

    @property
    def read_ahead(self) -> Any:
        """The :class:`ReadAhead` behind this stream, or ``None`` (for tests and stats)."""
        return self._chunks if isinstance(self._chunks, ReadAhead) else None

    def _fill(self) -> bool:
        if self._eof:
            return False
        if os.getpid() != self._pid:
            raise StorageError(
                f"{self.url}: a stream opened in process {self._pid} was read in process "
                f"{os.getpid()}. Open shards inside each DataLoader worker, not before forking."
            )
        chunk = self._chunks.next_chunk()
        if chunk is None:
            self._eof = True
            return False
        self._current = memoryview(chunk)
        return True

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
            piece = self._current[:wanted]
            self._current = self._current[len(piece) :]
            parts.append(piece.tobytes())
            wanted -= len(piece)
        data = b"".join(parts)
        self._offset += len(data)
        return data

    def readall(self) -> bytes:
        parts = []
        while True:
            data = self.read(8 * 2**20)
            if not data:
                return b"".join(parts)
            parts.append(data)

    def close(self) -> None:
        if not self.closed:
            self._chunks.close()
            self._current = memoryview(b"")
        super().close()
