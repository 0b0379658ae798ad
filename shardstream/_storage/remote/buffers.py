"""Receive buffers reused within a process: a large GET is read into one, handed to its reader
as a view, and taken back once the reader is done and no other view of it is alive."""

from __future__ import annotations

import http.client
import threading
from collections.abc import Callable
from typing import Any

from shardstream._storage.background import ProcessLocal
from shardstream._storage.remote.retry import ShortReadError

__all__ = ["RECEIVE_BUFFERS", "ReceiveBuffers", "read_body", "recycle"]

#: Buffers are kept for reads of at least this many bytes (small ones are cheap to allocate).
MIN_POOLED_BYTES = 2**20
_ROUND_BYTES = 2**20
#: Bytes asked of a response body per ``readinto`` (the socket's reads are shorter anyway).
_SLICE_BYTES = 2**20


class ReceiveBuffers:
    """A per-process pool of large ``bytearray`` s, at most ``max_bytes`` kept at once.

    Examples:
        >>> pool = ReceiveBuffers(max_bytes=8 * 2**20)
        >>> buffer = pool.take(3 * 2**20)
        >>> len(buffer) >= 3 * 2**20
        True
        >>> pool.give(buffer); pool.take(3 * 2**20) is buffer
        True
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._free: list[bytearray] = []
        self._lock = threading.Lock()
        self.reused = 0  # takes answered with a kept buffer (tests and tuning read it)

    def take(self, size: int) -> bytearray:
        """A buffer of at least ``size`` bytes (and at most about twice that), reused if any."""
        with self._lock:
            fitting = [b for b in self._free if size <= len(b) <= 2 * size + _ROUND_BYTES]
            if fitting:
                buffer = min(fitting, key=len)
                self._free.remove(buffer)
                self.reused += 1
                return buffer
        return bytearray(-(-size // _ROUND_BYTES) * _ROUND_BYTES)

    def give(self, buffer: bytearray) -> None:
        """Keep ``buffer`` for a later :meth:`take` (dropped when the pool is full)."""
        with self._lock:
            if sum(map(len, self._free)) + len(buffer) <= self.max_bytes:
                self._free.append(buffer)

    @property
    def kept_bytes(self) -> int:
        """Bytes of buffers waiting to be reused."""
        with self._lock:
            return sum(map(len, self._free))


#: Each process's pool (a forked child starts empty): enough for a few GETs in flight per
#: open stream.
RECEIVE_BUFFERS: ProcessLocal[ReceiveBuffers] = ProcessLocal(lambda: ReceiveBuffers(48 * 2**20))


def read_body(
    readinto: Callable[[memoryview], int | None], num_bytes: int
) -> tuple[bytearray | memoryview, BaseException | None]:
    """Up to ``num_bytes`` of a response body through its ``readinto``, without joins.

    Reads of :data:`MIN_POOLED_BYTES` or more land in a reused buffer and come back as a view of
    it (give it back with :func:`recycle`); smaller ones as a ``bytearray``. A failure comes
    back beside the bytes received before it (a retry resumes after them); with none received,
    the buffer is given back at once and the bytes are empty.
    """
    pooled = num_bytes >= MIN_POOLED_BYTES
    buffers = RECEIVE_BUFFERS.get()
    buffer = buffers.take(num_bytes) if pooled else bytearray(num_bytes)
    view = memoryview(buffer)
    received = 0
    error: BaseException | None = None
    try:
        while received < num_bytes:
            count = readinto(view[received : received + _SLICE_BYTES])
            if not count:  # the server closed early (http.client raises nothing here)
                error = ShortReadError(f"response body ended after {received} bytes")
                break
            received += count
    except http.client.HTTPException as exc:  # IncompleteRead...: a body cut short
        error = ShortReadError(f"response body broken: {exc!r}")
    except Exception as exc:  # socket timeouts, resets: classified by the Retrier
        error = exc
    finally:
        view.release()
    if error is not None and not received:
        if pooled:
            buffers.give(buffer)
        return bytearray(), error
    if pooled:
        return memoryview(buffer)[:received], error
    if received < num_bytes:
        del buffer[received:]
    return buffer, error


def recycle(extent: Any) -> None:
    """Give ``extent``'s receive buffer back to this process's pool: its reader is done with it.

    The caller owns ``extent``: it took it from an extent source, handed no view of it on, and
    reads it no more. The view is released here (a holder that kept it anyway gets an error on
    its next use, never other bytes), and the buffer is kept for reuse only when no other view
    of it is alive (a slice, a numpy array: see :func:`_exported`). ``bytes``, small buffers
    and anything else are left to the garbage collector.
    """
    if type(extent) is not memoryview:
        return
    buffer = extent.obj
    if type(buffer) is not bytearray or len(buffer) < MIN_POOLED_BYTES:
        return
    try:
        extent.release()
    except BufferError:  # the view itself lends its buffer to something still alive
        return
    if not _exported(buffer):
        RECEIVE_BUFFERS.get().give(buffer)


def _exported(buffer: bytearray) -> bool:
    """Whether a view of ``buffer`` is alive. A bytearray refuses to change its size while any
    view exports it (the buffer protocol's rule, not a count of references), so a one-byte
    shrink tells; it moves no bytes, and the length is put back."""
    try:
        del buffer[-1:]
    except BufferError:
        return True
    buffer.append(0)
    return False
