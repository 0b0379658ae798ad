"""Where this process sits: rank, world size, DataLoader worker. The only reader of that state.

:func:`current_context` is the one function in shardstream that reads ``torch.distributed`` and
``get_worker_info()``; everything else takes a :class:`Context` (or its numbers) as arguments, so
it can be tested without processes. :func:`post_first` is the one use of the process group
(its key-value store: ranks agree on the version of a growing dataset they read without waiting
for each other); shardstream runs no collective.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from collections.abc import Iterator

from shardstream.errors import ConfigError

__all__ = ["Context", "current_context", "post_first", "worker_thread"]

#: The worker a thread of a thread loader plays: ``(worker, num_workers)``, per thread.
_thread_worker = threading.local()


@dataclasses.dataclass(frozen=True)
class Context:
    """Rank and worker of the calling process.

    Attributes:
        rank: Rank among ``world_size`` training processes.
        world_size: Number of training processes.
        worker: DataLoader worker id, 0 in the main process.
        num_workers: DataLoader workers per rank (or threads of a thread loader), 1 when
            loading in the main process.
        in_worker: Inside a DataLoader worker process (batches then go to shared memory).
        in_thread: On a thread of a thread loader (``StreamingDataLoader(num_threads=N)``):
            the worker ``worker`` of ``num_workers``, in the training process.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    in_worker: bool = False
    in_thread: bool = False


@contextlib.contextmanager
def worker_thread(worker: int, num_workers: int) -> Iterator[None]:
    """Make the calling thread play DataLoader worker ``worker`` of ``num_workers``.

    A thread loader runs each worker's pass on a thread of the training process; inside this
    block :func:`current_context` gives that thread the worker's place, as
    ``get_worker_info()`` gives a worker process its own, so the same plan is read.

    Example:
        >>> with worker_thread(1, 2):
        ...     current_context().worker
        1
    """
    if not 0 <= worker < num_workers:
        raise ConfigError(f"worker must be in [0, num_workers={num_workers}), got {worker}")
    _thread_worker.place = (worker, num_workers)
    try:
        yield
    finally:
        del _thread_worker.place


def current_context(rank: int | None = None, world_size: int | None = None) -> Context:
    """Read rank/world size (arguments, else ``torch.distributed``) and the DataLoader worker.

    Args:
        rank: Explicit rank; overrides ``torch.distributed``. Give both or neither.
        world_size: Explicit world size.

    Raises:
        ConfigError: Only one of ``rank``/``world_size`` was given, or they are inconsistent.

    Examples:
        >>> current_context(rank=1, world_size=4).rank
        1
    """
    import torch.distributed as dist
    import torch.utils.data

    if (rank is None) != (world_size is None):
        raise ConfigError("pass both rank and world_size, or neither (to use torch.distributed)")
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = 0, 1
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank}")
    place = getattr(_thread_worker, "place", None)
    if place is not None:
        return Context(rank, world_size, place[0], place[1], in_thread=True)
    info = torch.utils.data.get_worker_info()
    if info is None:
        return Context(rank, world_size)
    return Context(rank, world_size, info.id, info.num_workers, in_worker=True)


def post_first(key: str, value: str) -> str | None:
    """The value the job's first process to post under ``key`` posted (``value`` if this one).

    Under torch.distributed this is one atomic compare-and-set on the process group's store
    (the ``TCPStore`` or ``FileStore`` the group was made with): no rank waits for another, so
    any subset of the ranks may call it, at any time. Without torch.distributed, or with one
    rank, it returns None without talking to anyone.

    Args:
        key: A key that names what is agreed on (the same on every rank).
        value: What this process proposes.

    Examples:
        >>> post_first("shardstream/example", "3") is None  # without torch.distributed
        True
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    held = c10d._get_default_store().compare_set(key, "", value)
    return bytes(held).decode()
