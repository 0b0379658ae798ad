"""Where this process sits: rank, world size, DataLoader worker. The only reader of that state.

:func:`current_context` is the one function in shardstream that reads ``torch.distributed`` and
``get_worker_info()``; everything else takes a :class:`Context` (or its numbers) as arguments, so
it can be tested without processes. :func:`gather_from_ranks` is the one collective shardstream
runs (ranks agreeing on the version of a growing dataset they read).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shardstream.errors import ConfigError

__all__ = ["Context", "current_context", "gather_from_ranks"]


@dataclasses.dataclass(frozen=True)
class Context:
    """Rank and worker of the calling process.

    Attributes:
        rank: Rank among ``world_size`` training processes.
        world_size: Number of training processes.
        worker: DataLoader worker id, 0 in the main process.
        num_workers: DataLoader workers per rank, 1 when loading in the main process.
        in_worker: Inside a DataLoader worker process (batches then go to shared memory).
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    in_worker: bool = False


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
    info = torch.utils.data.get_worker_info()
    if info is None:
        return Context(rank, world_size)
    return Context(rank, world_size, info.id, info.num_workers, in_worker=True)


def gather_from_ranks(value: Any, explicit_ranks: bool = False) -> list[Any]:
    """Every training process's ``value``, in rank order: a collective under torch.distributed.

    Every rank must call it at the same point of the program, in the training process (a
    DataLoader worker cannot take part). Without torch.distributed, with one rank, or when the
    ranks were given explicitly (``explicit_ranks``: the processes are not torch.distributed's),
    it returns ``[value]`` without talking to anyone.

    Args:
        value: A small picklable value (a few bytes: it is sent to every rank).
        explicit_ranks: Ranks come from ``StreamOptions(rank=..., world_size=...)``.

    Raises:
        ConfigError: Called in a DataLoader worker while torch.distributed is initialized.

    Examples:
        >>> gather_from_ranks(3)  # without torch.distributed
        [3]
    """
    import torch.distributed as dist
    import torch.utils.data

    if explicit_ranks or not (dist.is_available() and dist.is_initialized()):
        return [value]
    world_size = dist.get_world_size()
    if world_size == 1:
        return [value]
    if torch.utils.data.get_worker_info() is not None:
        raise ConfigError(
            "ranks agree on a dataset's version in the training process, not in a DataLoader "
            "worker: call set_epoch / refresh_version there, on every rank"
        )
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, value)
    return gathered
