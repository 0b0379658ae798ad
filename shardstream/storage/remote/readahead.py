"""Read-ahead for remote streams: a daemon thread that fetches extents ahead of the reader.

Network transfer then overlaps the caller's decoding, with memory bounded by ``max_bytes``.
"""

from __future__ import annotations

import collections
import threading

from shardstream.storage.remote.ranged import Extent, ExtentSource

__all__ = ["ReadAhead"]


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
