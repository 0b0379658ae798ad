"""Small tensors (labels) that cross the DataLoader worker queue inside the pickle.

Batch buffers that DataLoader workers reuse, instead of a new shared-memory segment per batch.

A DataLoader worker normally puts every batch in a fresh shared-memory segment: the worker
page-faults on every page as it fills it (the kernel zeroes each one), the training process maps
it and faults again as it reads, and both unmap it after one use. For a batch of 64 float images
at 224x224 that is about 9,400 pages per process per batch, most of the cost of moving a batch.

Here each worker keeps a few buffers (one ``memfd`` each, mapped once in the worker and once in
the training process) and reuses a buffer once the training process is done with it:

- the worker takes a free buffer, fills it, and hands out a :class:`PooledTensor` view of it;
- pickled for the worker queue, a ``PooledTensor`` is only a reference (buffer, generation,
  shape); the file descriptor travels once, until the receiver says it has mapped the buffer;
- the receiver turns it into a plain tensor over its own mapping, and marks the buffer free when
  the last tensor or view on it is freed (a finalizer on the array that owns the storage), so a
  batch kept, sliced or pinned later is never overwritten;
- when no buffer is free (the consumer holds many batches) or a batch is too small to be worth
  it, the worker falls back to a fresh segment, as PyTorch does. Nothing ever waits.

Without workers the same reuse saves the page faults of a fresh large allocation per batch:
batches are then plain tensors on buffers in the process's own memory, reused once freed.

Buffers are Linux-only (``os.memfd_create``); elsewhere the fallback is always used."""

from __future__ import annotations

import dataclasses
import mmap
import multiprocessing.reduction
import os
import secrets
import threading
import weakref
from multiprocessing.util import Finalize
from typing import Any

import numpy as np
import torch

from shardstream._storage.background import ProcessLocal

__all__ = [
    "InlineTensor",
    "MIN_BYTES",
    "PooledTensor",
    "buffer_stats",
    "empty",
    "inline",
    "typed_view",
]


MIN_BYTES = 64 * 1024  # smaller batches are cheap to allocate; not worth a shared buffer


class InlineTensor(torch.Tensor):
    """A small tensor (labels, tiny images) that crosses the worker queue inside the pickle.

    PyTorch would put it in a new shared-memory segment and hand its file descriptor over a
    socket: about a millisecond per batch, for a few hundred bytes. Operations on it return
    plain tensors; the receiver gets a plain tensor.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)


def inline(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as an :class:`InlineTensor` when it is small (under :data:`MIN_BYTES`)."""
    if tensor.nbytes >= MIN_BYTES or type(tensor) is not torch.Tensor:
        return tensor
    return tensor.as_subclass(InlineTensor)


def _reduce_inline(tensor: InlineTensor) -> Any:
    plain = tensor.as_subclass(torch.Tensor).contiguous()
    data = plain.reshape(-1).view(torch.uint8).numpy().tobytes() if plain.numel() else b""
    return _from_bytes, (data, str(plain.dtype).removeprefix("torch."), tuple(plain.shape))


def _from_bytes(data: bytes, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    if not data:
        return torch.empty(shape, dtype=getattr(torch, dtype))
    flat = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return typed_view(flat, getattr(torch, dtype), shape)


def typed_view(flat: torch.Tensor, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A flat ``uint8`` tensor viewed as ``dtype`` with ``shape`` (no copy)."""
    return flat.view(dtype).view(shape)


multiprocessing.reduction.ForkingPickler.register(InlineTensor, _reduce_inline)


HEADER = 4096  # one page of flags before the data, so the data stays page aligned
BUSY, ACKED, CLOSED = 0, 1, 2  # uint64 words of the header
ALIGN = 1 << 20


class PooledTensor(torch.Tensor):
    """A tensor on a reusable worker buffer; crosses the worker queue as a reference.

    Operations on it return plain tensors. Pickled by any pickler other than the
    multiprocessing one (``torch.save``, ``pickle.dumps``), it is a plain tensor copy.
    """

    __torch_function__ = torch._C._disabled_torch_function_impl  # type: ignore[assignment]

    _lease: _Lease | None = None

    def __reduce_ex__(self, protocol: Any) -> Any:
        return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)


@dataclasses.dataclass(eq=False)  # buffers are equal only to themselves (their arrays)
class _Buffer:
    """One reusable buffer in the worker: a memfd mapped once."""

    fd: int
    mapping: mmap.mmap | None
    words: np.ndarray
    data: np.ndarray
    number: int
    generation: int

    @classmethod
    def create(cls, number: int, generation: int, capacity: int, shared: bool) -> _Buffer:
        if not shared:  # the training process's own memory (0 workers): reused all the same
            words = np.zeros(HEADER // 8, dtype=np.uint64)
            return cls(-1, None, words, np.empty(capacity, np.uint8), number, generation)
        fd = os.memfd_create(f"shardstream-batch-{number}", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, HEADER + capacity)
            mapping = mmap.mmap(fd, HEADER + capacity)
        except BaseException:
            os.close(fd)
            raise
        words = np.frombuffer(mapping, dtype=np.uint64, count=HEADER // 8)
        data = np.frombuffer(mapping, dtype=np.uint8, offset=HEADER)
        return cls(fd, mapping, words, data, number, generation)

    @property
    def capacity(self) -> int:
        return int(self.data.nbytes)

    @property
    def free(self) -> bool:
        return int(self.words[BUSY]) == 0

    def close(self) -> None:
        self.words[CLOSED] = 1
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


@dataclasses.dataclass
class _Lease:
    """One use of a buffer: set ``sent`` once the batch was pickled for the queue."""

    buffer: _Buffer
    nbytes: int
    sent: bool = False


class _Pool:
    """The buffers of one process: shared (a worker's) or in its own memory."""

    def __init__(self, max_buffers: int, shared: bool) -> None:
        self.token = secrets.randbits(62)
        self.shared = shared
        self.max_buffers = max_buffers
        self.buffers: list[_Buffer] = []
        self.generations = 0
        self._lock = threading.Lock()  # threads of a thread loader take buffers at once
        Finalize(self, _close_all, args=(self.buffers,), exitpriority=10)

    def take(self, nbytes: int) -> _Lease | None:
        """A free buffer holding at least ``nbytes`` (grown or added if needed), else None."""
        with self._lock:
            return self._take(nbytes)

    def _take(self, nbytes: int) -> _Lease | None:
        free = [buffer for buffer in self.buffers if buffer.free]
        fits = [buffer for buffer in free if buffer.capacity >= nbytes]
        if fits:
            buffer = min(fits, key=lambda b: b.capacity)
        elif free or len(self.buffers) < self.max_buffers:
            self.generations += 1
            capacity = -(-nbytes * 5 // 4 // ALIGN) * ALIGN  # headroom for varying raw batches
            number = free[0].number if free else len(self.buffers)
            buffer = _Buffer.create(number, self.generations, capacity, self.shared)
            if free:  # a free buffer too small: replace it (the receiver maps the new one)
                old = self.buffers.index(free[0])
                self.buffers[old].close()
                self.buffers[old] = buffer
            else:
                self.buffers.append(buffer)
        else:
            return None
        buffer.words[BUSY] = 1
        return _Lease(buffer, nbytes)


#: This process's pools, by ``shared`` (a forked child makes its own).
_pools: ProcessLocal[dict[bool, _Pool]] = ProcessLocal(dict)


def _close_all(buffers: list[_Buffer]) -> None:
    for buffer in buffers:
        buffer.close()
    buffers.clear()


def empty(
    shape: tuple[int, ...], dtype: torch.dtype, max_buffers: int, shared: bool = True
) -> torch.Tensor:
    """An uninitialised tensor on a reusable buffer of this process.

    Args:
        shape: Shape of the tensor.
        dtype: Its dtype.
        max_buffers: Buffers this process keeps (0: always a fresh tensor).
        shared: For a DataLoader worker: the buffer is shared memory and the tensor a
            :class:`PooledTensor`; when no buffer is free, a fresh shared-memory tensor.
            Otherwise a plain tensor in this process's memory, reused once freed.
    """
    nbytes = int(np.prod(shape, dtype=np.int64)) * torch.empty((), dtype=dtype).element_size()
    lease = None
    if max_buffers > 0 and nbytes >= MIN_BYTES and (hasattr(os, "memfd_create") or not shared):
        pools = _pools.get()
        pool = pools.get(shared)
        if pool is None:
            pool = pools[shared] = _Pool(max_buffers, shared)
        pool.max_buffers = max_buffers
        lease = pool.take(nbytes)
    if lease is None:
        if not shared:
            return torch.empty(shape, dtype=dtype)
        if nbytes < MIN_BYTES:
            return torch.empty(shape, dtype=dtype).as_subclass(InlineTensor)
        storage = torch.UntypedStorage._new_shared(nbytes)
        return torch.empty(0, dtype=dtype).set_(storage).view(shape)
    exporter = lease.buffer.data[:nbytes]  # owns the storage: freed when the last view is
    weakref.finalize(exporter, _unsent, lease).atexit = False
    tensor = typed_view(torch.from_numpy(exporter), dtype, shape)
    if not shared:
        return tensor
    pooled = tensor.as_subclass(PooledTensor)
    pooled._lease = lease
    return pooled


def _unsent(lease: _Lease) -> None:
    """The batch died without crossing a queue (or was never meant to); the buffer is free."""
    if not lease.sent:
        lease.buffer.words[BUSY] = 0


def _reduce(tensor: PooledTensor) -> Any:
    lease = tensor._lease
    plain = tensor.as_subclass(torch.Tensor)
    if lease is None or lease.sent or plain.storage_offset() or not plain.is_contiguous():
        return _plain, (plain.clone(),)  # sent twice, or a view: an ordinary shared copy
    lease.sent = True
    buffer = lease.buffer
    handle = None
    if int(buffer.words[ACKED]) != buffer.generation:  # receiver has not mapped it yet
        handle = multiprocessing.reduction.DupFd(buffer.fd)
    pools = _pools.peek() or {}
    token = pools[True].token if True in pools else 0
    args = (token, os.getpid(), buffer.number, buffer.generation, handle)
    return _rebuild, (*args, lease.nbytes, str(plain.dtype).removeprefix("torch."), plain.shape)


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


@dataclasses.dataclass
class _Attached:
    """Receiver side: one worker buffer, mapped once."""

    generation: int
    pid: int
    mapping: mmap.mmap
    words: np.ndarray
    data: np.ndarray


_attached: dict[tuple[int, int], _Attached] = {}
_mapped = [0]


def buffer_stats() -> dict[str, int]:
    """Worker buffers this process holds mapped now, and has mapped in all (diagnostics)."""
    return {"attached": len(_attached), "mapped": _mapped[0]}


def _rebuild(
    token: int,
    pid: int,
    number: int,
    generation: int,
    handle: Any,
    nbytes: int,
    dtype: str,
    shape: tuple[int, ...],
) -> torch.Tensor:
    """Receiver side of :func:`_reduce`: a plain tensor over this process's mapping."""
    fd = handle.detach() if handle is not None else None
    try:
        entry = _attached.get((token, number))
        if entry is None or entry.generation != generation:
            if fd is None:
                raise RuntimeError(
                    f"shardstream: batch buffer {number} (generation {generation}) of worker "
                    f"pid {pid} arrived without its file descriptor; was the batch forwarded "
                    "from another process? Set StreamOptions(batch_buffers=0) to turn buffer "
                    "reuse off."
                )
            if all(key[0] != token for key in _attached):  # a new worker: did others end?
                _forget_finished()
            mapping = mmap.mmap(fd, 0)
            words = np.frombuffer(mapping, dtype=np.uint64, count=HEADER // 8)
            data = np.frombuffer(mapping, dtype=np.uint8, offset=HEADER)
            entry = _Attached(generation, pid, mapping, words, data)
            _attached[(token, number)] = entry
            _mapped[0] += 1
            words[ACKED] = generation
    finally:
        if fd is not None:
            os.close(fd)
    exporter = entry.data[:nbytes]
    weakref.finalize(exporter, _release, entry.words).atexit = False
    return typed_view(torch.from_numpy(exporter), getattr(torch, dtype), tuple(shape))


def _release(words: np.ndarray) -> None:
    """Receiver side: the last tensor on the buffer is gone; the worker may reuse it."""
    words[BUSY] = 0


def _forget_finished() -> None:
    """Unmap buffers of workers that exited (their memory is then returned)."""
    for key, entry in list(_attached.items()):
        if int(entry.words[CLOSED]) or not _alive(entry.pid):
            del _attached[key]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


multiprocessing.reduction.ForkingPickler.register(PooledTensor, _reduce)
