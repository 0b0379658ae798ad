"""Plans for shards of unknown length (no manifest): whole shards dealt to workers.

Without counts nothing can be split exactly: slot ``k`` of the epoch's shard order goes to the
``k % (world_size * num_workers)``-th (rank, worker) pair, ranks may get different numbers of
samples, and a worker gets no shard at all when there are fewer shards than ranks x workers.
Each worker interleaves its shards and shuffles them through a bounded buffer (at run time:
:mod:`shardstream.streaming.worker.wholeshardpass`); a resume reads and drops what was consumed.
Indexing the shards (``shardstream index``) gives them a manifest and every guarantee of counted
datasets.
"""

from __future__ import annotations

import dataclasses

from shardstream.streaming.planning.sequence import shard_order

__all__ = ["WholeShardPlan", "plan_whole_shards", "role_after"]


@dataclasses.dataclass(frozen=True)
class WholeShardPlan:
    """One worker's whole shards in a pass, its stages' seed, and what it already yielded."""

    shards: tuple[int, ...]
    seed: tuple[int, ...]
    skip_items: int


def plan_whole_shards(
    num_shards: int,
    seed: int,
    shuffle: bool,
    epoch: int,
    rank: int,
    world_size: int,
    role: int,
    num_workers: int,
    skip: int = 0,
) -> WholeShardPlan:
    """The shards of worker ``role`` of ``rank``, which already yielded ``skip`` items.

    Examples:
        >>> plan_whole_shards(4, 0, False, 0, rank=0, world_size=1, role=1, num_workers=2)
        WholeShardPlan(shards=(1, 3), seed=(0, 0, 0, 1), skip_items=0)
    """
    slots = world_size * num_workers
    order = shard_order(num_shards, seed, epoch, shuffle).tolist()
    shards = tuple(order[rank * num_workers + role :: slots])
    return WholeShardPlan(shards, (seed, epoch, rank, role), skip)


def role_after(worker: int, num_workers: int, consumed: int) -> tuple[int, int]:
    """``(role, items it yielded)`` of a fresh loader's ``worker`` after ``consumed`` items.

    A DataLoader asks its workers in turn and a fresh one starts at worker 0, so after
    ``consumed`` items worker ``i`` plays worker ``(i + consumed) % num_workers`` of the
    original turn order (counts are unknown: no worker is assumed to have run out).

    Examples:
        >>> role_after(0, 3, 5)
        (2, 1)
    """
    role = (worker + consumed) % num_workers
    return role, max(0, -(-(consumed - role) // num_workers))
