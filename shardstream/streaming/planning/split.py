"""Pure epoch planning: which samples each (rank, worker) reads, in which pieces.

Every process computes the same plan from the same inputs, so no communication is needed:

1. The shard order of an epoch is a permutation seeded by ``(seed, epoch)``, drawn *before*
   splitting, so a rank sees different shards in different epochs.
2. The ordered shards form one virtual sequence of samples. It is cut into ``world_size`` equal
   parts: ``"pad"`` rounds up and wraps around to the start (every sample at least once, fewer
   than ``world_size`` repeats); ``"drop"`` rounds down (fewer than ``world_size`` left out).
3. A rank's part is cut into blocks whose size is a multiple of the batch size; block ``j`` goes
   to worker ``j % num_workers``. Every rank has the same part length, so every rank has the
   same per-worker sample and batch counts, and only one worker per rank ends on a short batch.
4. Blocks are cut at shard boundaries and into pieces of at most ``piece_size`` samples. A worker
   reads several pieces at once (see :mod:`shardstream.streaming.planning.interleave`) so that
   shards written in class order still give mixed batches.

Nothing here reads torch, the environment or storage.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np

from shardstream.errors import ConfigError

__all__ = [
    "POLICIES",
    "Piece",
    "PlanOptions",
    "batches_consumed_per_worker",
    "cut_sequence",
    "epoch_sequence",
    "next_worker",
    "plan_whole_shards",
    "plan_worker",
    "plan_worker_in",
    "plan_worker_placed",
    "rank_batch_count",
    "samples_per_rank",
    "shard_order",
    "worker_batch_counts",
    "worker_sample_counts",
]

POLICIES = ("pad", "drop")


@dataclasses.dataclass(frozen=True)
class Piece:
    """Samples ``[start, stop)`` of shard number ``shard`` (an index into the shard list)."""

    shard: int
    start: int
    stop: int

    @property
    def num_samples(self) -> int:
        """Samples in the piece."""
        return self.stop - self.start


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """How an epoch is laid out; identical on every rank and worker.

    Attributes:
        seed: Base seed of every random choice.
        shuffle: Permute the shard order and pieces per epoch.
        policy: ``"pad"`` or ``"drop"`` (see the module docstring).
        batch_size: Samples per batch made in the worker (1 when batching is off).
        block_size: Samples per block dealt to workers, rounded up to a multiple of
            ``batch_size``.
        piece_size: Longest run of consecutive samples read from one stream.
    """

    seed: int = 0
    shuffle: bool = True
    policy: str = "pad"
    batch_size: int = 1
    block_size: int = 64
    piece_size: int = 32

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        for name in ("batch_size", "block_size", "piece_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    """The epoch's shard order: a permutation seeded by ``(seed, epoch)``, or ``0..n-1``."""
    if not shuffle:
        return list(range(num_shards))
    rng = np.random.default_rng([seed, epoch, 0x5EED])
    return [int(index) for index in rng.permutation(num_shards)]


def samples_per_rank(num_samples: int, world_size: int, policy: str = "pad") -> int:
    """Samples every rank yields per epoch: ``ceil`` (pad) or ``floor`` (drop) of N / world."""
    if policy == "pad":
        return -(-num_samples // world_size)
    return num_samples // world_size


def _block(num_rank_samples: int, num_workers: int, options: PlanOptions) -> int:
    """Block size: a multiple of the batch size, small enough that every worker gets data."""
    batch = options.batch_size
    full_batches_per_worker = num_rank_samples // batch // max(1, num_workers)
    wanted = min(-(-options.block_size // batch), full_batches_per_worker)
    return batch * max(1, wanted)


def worker_sample_counts(
    num_rank_samples: int, num_workers: int, options: PlanOptions
) -> list[int]:
    """Samples each worker of a rank yields (identical on every rank)."""
    block = _block(num_rank_samples, num_workers, options)
    counts = [0] * num_workers
    for index, start in enumerate(range(0, num_rank_samples, block)):
        counts[index % num_workers] += min(block, num_rank_samples - start)
    return counts


def worker_batch_counts(num_rank_samples: int, num_workers: int, options: PlanOptions) -> list[int]:
    """Batches each worker of a rank yields; the last batch of a worker may be short."""
    batch = options.batch_size
    counts = worker_sample_counts(num_rank_samples, num_workers, options)
    return [-(-count // batch) for count in counts]


def rank_batch_count(num_rank_samples: int, options: PlanOptions) -> int:
    """Batches per rank; independent of the number of workers."""
    return -(-num_rank_samples // options.batch_size)


def batches_consumed_per_worker(batch_counts: Sequence[int], consumed: int) -> list[int]:
    """How many batches each worker had produced after ``consumed`` batches left the loader.

    A DataLoader over an IterableDataset takes batches from its workers round-robin, skipping
    workers that are exhausted; this replays that order on counts alone.
    """
    taken = [0] * len(batch_counts)
    remaining = consumed
    while remaining > 0:
        active = [w for w, count in enumerate(batch_counts) if taken[w] < count]
        if not active:
            break
        rounds = min(remaining // len(active), min(batch_counts[w] - taken[w] for w in active))
        if rounds == 0:
            for worker in active[:remaining]:
                taken[worker] += 1
            break
        for worker in active:
            taken[worker] += rounds
        remaining -= rounds * len(active)
    return taken


def next_worker(batch_counts: Sequence[int], consumed: int) -> int:
    """The worker whose turn it is after ``consumed`` batches (round-robin, skipping ends).

    A fresh DataLoader always asks worker 0 first, so a loader resumed mid-epoch lets its worker
    ``i`` play original worker ``(i + next_worker(...)) % num_workers``.
    """
    num_workers = len(batch_counts)
    taken = [0] * num_workers
    served, position = 0, 0
    while served < consumed and served < sum(batch_counts):
        worker = position % num_workers
        position += 1
        if taken[worker] < batch_counts[worker]:
            taken[worker] += 1
            served += 1
    return position % num_workers


def epoch_sequence(counts: Sequence[int], epoch: int, options: PlanOptions) -> list[Piece]:
    """The epoch's virtual sequence: every non-empty shard, whole, in the epoch's shard order."""
    order = shard_order(len(counts), options.seed, epoch, options.shuffle)
    return [Piece(shard, 0, counts[shard]) for shard in order if counts[shard] > 0]


Placed = tuple[Piece, int]  # a piece and the virtual position of its first sample


def _wrapped_cut(sequence: Sequence[Piece], first: int, length: int) -> list[Placed]:
    """Positions ``[first, first + length)`` of ``sequence`` laid end to end, wrapping around."""
    total = sum(piece.num_samples for piece in sequence)
    starts = list(itertools.accumulate((piece.num_samples for piece in sequence), initial=0))
    pieces: list[Placed] = []
    position, end = first, first + length
    while position < end:
        offset = position % total
        slot = int(np.searchsorted(starts, offset, side="right")) - 1
        piece = sequence[slot]
        start = piece.start + offset - starts[slot]
        take = min(piece.stop - start, end - position)
        pieces.append((Piece(piece.shard, start, start + take), offset))
        position += take
    return pieces


def _cut(pieces: Sequence[Placed], first: int, length: int) -> list[Placed]:
    """Positions ``[first, first + length)`` of a run of placed pieces laid end to end."""
    result: list[Placed] = []
    position = 0
    for piece, placed_at in pieces:
        lo, hi = max(first, position), min(first + length, position + piece.num_samples)
        if lo < hi:
            offset = piece.start - position
            cut = Piece(piece.shard, lo + offset, hi + offset)
            result.append((cut, placed_at + lo - position))
        position += piece.num_samples
        if position >= first + length:
            break
    return result


def cut_sequence(sequence: Sequence[Piece], first: int, length: int) -> list[Piece]:
    """Positions ``[first, first + length)`` of ``sequence`` laid end to end (no wrapping)."""
    placed = [(piece, 0) for piece in sequence]
    return [piece for piece, _ in _cut(placed, first, length)]


def plan_worker(
    counts: Sequence[int],
    epoch: int,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    options: PlanOptions,
) -> list[Piece]:
    """The pieces one worker of one rank reads in an epoch, in reading order.

    Args:
        counts: Samples per shard, in shard-list order (from the manifest).
        epoch: Epoch number; with ``options.seed`` it fixes the shard order.
        rank: This process's rank in ``[0, world_size)``.
        world_size: Number of ranks.
        worker: This DataLoader worker in ``[0, num_workers)``.
        num_workers: DataLoader workers per rank (1 for ``num_workers=0``).
        options: Seed, shuffle, policy and sizes.

    Returns:
        Pieces of at most ``options.piece_size`` samples whose lengths add up to
        ``worker_sample_counts(...)[worker]``.

    Example:
        >>> [p.num_samples for p in plan_worker([5, 5], 0, 0, 2, 0, 1, PlanOptions(piece_size=4))]
        [4, 1]
    """
    if sum(counts) == 0:
        raise ConfigError("the dataset has no samples: every shard in the manifest is empty")
    sequence = epoch_sequence(counts, epoch, options)
    return plan_worker_in(sequence, rank, world_size, worker, num_workers, options)


def plan_worker_in(
    sequence: Sequence[Piece],
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    options: PlanOptions,
) -> list[Piece]:
    """:func:`plan_worker` over any virtual sequence of samples (e.g. what an epoch has left).

    The sequence is cut into ``world_size`` equal parts (``pad`` wraps around, ``drop`` leaves
    out fewer than ``world_size``), each part into batch-aligned blocks dealt to workers in
    turn, and blocks into pieces of at most ``options.piece_size`` samples.
    """
    placed = plan_worker_placed(sequence, rank, world_size, worker, num_workers, options)
    return [piece for piece, _ in placed]


def plan_worker_placed(
    sequence: Sequence[Piece],
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    options: PlanOptions,
) -> list[Placed]:
    """:func:`plan_worker_in` with each piece's position in ``sequence`` (for replays)."""
    if not 0 <= rank < world_size or not 0 <= worker < num_workers:
        raise ConfigError(
            f"rank {rank} of {world_size} / worker {worker} of {num_workers} is out of range"
        )
    total = sum(piece.num_samples for piece in sequence)
    per_rank = samples_per_rank(total, world_size, options.policy)
    if per_rank == 0:
        return []
    rank_run = _wrapped_cut(sequence, rank * per_rank, per_rank)
    block = _block(per_rank, num_workers, options)
    pieces: list[Placed] = []
    for block_start in range(worker * block, per_rank, num_workers * block):
        for piece, placed_at in _cut(rank_run, block_start, min(block, per_rank - block_start)):
            for start in range(piece.start, piece.stop, options.piece_size):
                stop = min(start + options.piece_size, piece.stop)
                pieces.append((Piece(piece.shard, start, stop), placed_at + start - piece.start))
    return pieces


def plan_whole_shards(
    num_shards: int,
    epoch: int,
    rank: int,
    world_size: int,
    worker: int,
    num_workers: int,
    options: PlanOptions,
) -> list[Piece]:
    """Whole shards of unknown length (no manifest) for one worker.

    Slot ``k`` of the epoch's shard order goes to the ``k % (world_size * num_workers)``-th
    (rank, worker) pair, counting workers within ranks.

    Counts are unknown, so ranks may get different numbers of samples, and a worker may get
    no shard at all when there are fewer shards than ranks x workers.
    """
    slots = world_size * num_workers
    slot = rank * num_workers + worker
    order = shard_order(num_shards, options.seed, epoch, options.shuffle)
    return [Piece(shard, 0, -1) for shard in order[slot::slots]]
