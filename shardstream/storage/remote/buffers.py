"""Receive buffers reused within a process, handed out as views and taken back when unseen.

Every ranged GET is read into one buffer of its length
(:mod:`shardstream.storage.backends.s3client`).
Allocating a fresh multi-MiB buffer per GET costs more than the bytes' copy: ``bytearray(n)``
zeroes ``n`` bytes, and memory just returned to the OS faults back in page by page (measured in
DataLoader workers streaming from radosgw: 1.3-6.7 ms of CPU per 4.7 MB buffer, a fifth to a
third of the worker's CPU). :class:`ReceiveBuffers` keeps a few buffers per process instead.

A buffer is handed out as a ``memoryview`` of the bytes received. It is taken back only by
:func:`recycle`, and only when reference counts prove that nothing but the caller can reach the
view or the buffer (no slice, no other view, no reference kept anywhere): a chunk that is still
seen elsewhere is simply left to the garbage collector, so reuse can never change bytes that
somebody holds.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from shardstream.storage.processlocal import ProcessLocal

__all__ = ["RECEIVE_BUFFERS", "ReceiveBuffers", "recycle"]

#: Buffers are kept for reads of at least this many bytes (small ones are cheap to allocate).
MIN_POOLED_BYTES = 2**20
_ROUND_BYTES = 2**20


def _lone_argument_refs(value: object) -> int:
    return sys.getrefcount(value)


def _lone_local_refs() -> int:
    value = bytearray(1)
    return sys.getrefcount(value)


#: References to an object that only a call's argument holds (calibrated on this interpreter).
_ARGUMENT_REFS = _lone_argument_refs(memoryview(bytearray(1)))
#: References to an object that only one local variable holds.
_LOCAL_REFS = _lone_local_refs()


class ReceiveBuffers:
    """A per-process pool of large ``bytearray`` s, at most ``max_bytes`` kept at once.

    Example:
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


def recycle(chunk: Any) -> None:
    """Give ``chunk`` 's buffer back to this process's pool if nothing else can see it.

    Call it with the chunk as a temporary (``recycle(self._take_chunk())``) once the caller
    holds no other reference and no view of it. Anything else (``bytes``, a view someone else
    refers to, a buffer with other views alive) is left alone.
    """
    if type(chunk) is not memoryview or sys.getrefcount(chunk) > _ARGUMENT_REFS:
        return
    buffer = chunk.obj
    if type(buffer) is not bytearray or len(buffer) < MIN_POOLED_BYTES:
        return
    chunk.release()  # drops this view's export: the buffer is free once no other view remains
    del chunk
    if sys.getrefcount(buffer) <= _LOCAL_REFS:
        RECEIVE_BUFFERS.get().give(buffer)
