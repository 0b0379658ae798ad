"""What an epoch has left after a restart, at any world size and worker count. Torch-free.

An epoch is read in one or more *passes*. The first pass covers the epoch's virtual sequence
(:func:`~shardstream.streaming.planning.split.epoch_sequence`) with the layout the job started with:
``world_size`` ranks, ``num_workers`` workers per rank, ``batch_size`` samples per batch. A
checkpoint records how many batches each rank had consumed (ranks step together, so the count
is the same on every rank). Because every worker's sample order is a pure function of the
plan, which samples those batches held can be replayed on integers, with no I/O.

When a job restarts with another layout, the rest of the epoch becomes a new pass: the samples
of the previous pass that no rank consumed, as runs of consecutive samples in the epoch's
order. That sequence is planned like a whole epoch (equal parts per rank, ``pad``/``drop``),
so every rank again gets the same number of batches. A pass is described by a plain dict
(:class:`PassRecord`), and a chain of them describes any number of restarts within one epoch.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from shardstream.errors import ConfigError
from shardstream.streaming.planning.interleave import Interleave
from shardstream.streaming.planning.shuffle import ShuffleBuffer
from shardstream.streaming.planning.split import (
    Piece,
    PlanOptions,
    batches_consumed_per_worker,
    next_worker,
    plan_whole_shards,
    plan_worker_in,
    plan_worker_placed,
    samples_per_rank,
    worker_batch_counts,
    worker_sample_counts,
)

__all__ = [
    "Layout",
    "PassRecord",
    "StageOptions",
    "WorkerPlan",
    "build_stages",
    "consumed_positions",
    "last_worker",
    "pass_batches",
    "pass_sequence",
    "plan_pass_worker",
    "plan_whole_shards_worker",
    "worker_seed",
]


@dataclasses.dataclass(frozen=True)
class Layout:
    """How a pass is spread: ranks, DataLoader workers per rank, samples per batch."""

    world_size: int
    num_workers: int
    batch_size: int

    def as_dict(self) -> dict[str, int]:
        """Plain values for a state dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """A finished part of an epoch: its layout, and the batches each rank consumed in it."""

    layout: Layout
    consumed_batches: int

    def as_dict(self) -> dict[str, int]:
        """Plain values for a state dict."""
        return {**self.layout.as_dict(), "consumed_batches": self.consumed_batches}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PassRecord:
        """Inverse of :meth:`as_dict`."""
        layout = Layout(int(data["world_size"]), int(data["num_workers"]), int(data["batch_size"]))
        return cls(layout, int(data["consumed_batches"]))


@dataclasses.dataclass(frozen=True)
class StageOptions:
    """The worker stages' settings that fix the sample order within a worker."""

    shuffle: bool
    num_open: int
    buffer_size: int


def worker_seed(seed: int, epoch: int, rank: int, worker: int, pass_index: int) -> tuple[int, ...]:
    """Seed sequence of one worker's stages; later passes of an epoch draw afresh."""
    base = (seed, epoch, rank, worker)
    return base if pass_index == 0 else (*base, pass_index)


def build_stages(
    lengths: Sequence[int | None],
    open_piece: Any,
    seed: Sequence[int],
    stage: StageOptions,
) -> ShuffleBuffer:
    """Interleave a worker's pieces and put a shuffle buffer behind them."""
    source = Interleave(lengths, open_piece, stage.num_open, seed, stage.shuffle)
    return ShuffleBuffer(source, stage.buffer_size if stage.shuffle else 1, seed)


def _replay(
    placed: Sequence[tuple[Piece, int]], seed: Sequence[int], stage: StageOptions, count: int
) -> Iterator[int]:
    """Sequence positions of the first ``count`` samples a worker yields, found without reading."""
    lengths = [piece.num_samples for piece, _ in placed]
    stages = build_stages(lengths, lambda p, a, b: itertools.repeat(None, b - a), seed, stage)
    for (number, ordinal), _ in itertools.islice(iter(stages), count):
        yield placed[number][1] + ordinal


def consumed_positions(
    sequence: Sequence[Piece],
    record: PassRecord,
    epoch: int,
    pass_index: int,
    plan: PlanOptions,
    stage: StageOptions,
) -> np.ndarray:
    """Which positions of ``sequence`` the ranks consumed in a pass over it (a bool mask)."""
    layout = record.layout
    plan = dataclasses.replace(plan, batch_size=layout.batch_size)
    total = sum(piece.num_samples for piece in sequence)
    per_rank = samples_per_rank(total, layout.world_size, plan.policy)
    batch_counts = worker_batch_counts(per_rank, layout.num_workers, plan)
    sample_counts = worker_sample_counts(per_rank, layout.num_workers, plan)
    taken = batches_consumed_per_worker(batch_counts, record.consumed_batches)
    consumed = np.zeros(total, dtype=bool)
    for rank in range(layout.world_size):
        for worker in range(layout.num_workers):
            count = min(taken[worker] * layout.batch_size, sample_counts[worker])
            if count == 0:
                continue
            placed = plan_worker_placed(
                sequence, rank, layout.world_size, worker, layout.num_workers, plan
            )
            seed = worker_seed(plan.seed, epoch, rank, worker, pass_index)
            positions = np.fromiter(_replay(placed, seed, stage, count), dtype=np.int64)
            consumed[positions % total] = True  # pad wraps around to the start
    return consumed


def pass_sequence(
    base: Sequence[Piece],
    epoch: int,
    history: Sequence[PassRecord],
    plan: PlanOptions,
    stage: StageOptions,
) -> list[Piece]:
    """The virtual sequence of the pass that follows ``history`` within ``epoch``.

    ``base`` is the epoch's whole sequence (what a fresh pass reads). After earlier passes,
    it is every position of the last pass's sequence that no rank consumed, as runs in the
    same order; positions, not samples, so a sample that an epoch holds twice (a mixture that
    repeats a small stream) is read twice.

    Example:
        >>> plan, stage = PlanOptions(shuffle=False), StageOptions(False, 1, 1)
        >>> first = PassRecord(Layout(1, 1, 2), consumed_batches=1)
        >>> pass_sequence([Piece(0, 0, 3), Piece(1, 0, 2)], 0, [first], plan, stage)
        [Piece(shard=0, start=2, stop=3), Piece(shard=1, start=0, stop=2)]
    """
    sequence = list(base)
    for index, record in enumerate(history):
        consumed = consumed_positions(sequence, record, epoch, index, plan, stage)
        sequence = _runs_left(sequence, consumed)
    return sequence


def _runs_left(sequence: Sequence[Piece], consumed: np.ndarray) -> list[Piece]:
    """The positions of ``sequence`` not ``consumed``, as runs in the same order."""
    runs: list[Piece] = []
    position = 0
    for piece in sequence:
        left = ~consumed[position : position + piece.num_samples]
        edges = np.flatnonzero(np.diff(np.concatenate([[0], left.astype(np.int8), [0]])))
        for begin, end in zip(edges[::2], edges[1::2], strict=True):
            runs.append(Piece(piece.shard, piece.start + int(begin), piece.start + int(end)))
        position += piece.num_samples
    return runs


@dataclasses.dataclass(frozen=True)
class WorkerPlan:
    """What one worker reads in a pass: its pieces, its stages' seed, what it already yielded."""

    pieces: tuple[Piece, ...]
    seed: tuple[int, ...]
    skip_samples: int


def plan_pass_worker(
    sequence: Sequence[Piece],
    epoch: int,
    pass_index: int,
    rank: int,
    worker: int,
    layout: Layout,
    plan: PlanOptions,
    consumed: int = 0,
    rotate: bool = True,
) -> WorkerPlan:
    """One worker's share of a pass, resumed after ``consumed`` batches (or items).

    Args:
        sequence: The pass's virtual sequence (:func:`pass_sequence`).
        epoch: The epoch.
        pass_index: How many passes of this epoch came before (0 for a fresh epoch).
        rank: This rank.
        worker: This DataLoader worker (0 without workers).
        layout: The pass's layout (this job's world size, workers, batch size).
        plan: Seed, shuffle, policy, block and piece sizes.
        consumed: With ``rotate``, batches this *rank* consumed (a DataLoader takes them from
            its workers in turn, and a fresh one starts at worker 0, so the workers' roles are
            rotated to continue the turn order); without, batches this worker yielded (a
            loader that restores its turn order itself, such as ``StatefulDataLoader``).
        rotate: See ``consumed``.
    """
    plan = dataclasses.replace(plan, batch_size=layout.batch_size)
    total = sum(piece.num_samples for piece in sequence)
    per_rank = samples_per_rank(total, layout.world_size, plan.policy)
    batch_counts = worker_batch_counts(per_rank, layout.num_workers, plan)
    taken = consumed
    if rotate:
        worker = (worker + next_worker(batch_counts, consumed)) % layout.num_workers
        taken = batches_consumed_per_worker(batch_counts, consumed)[worker]
    pieces = plan_worker_in(sequence, rank, layout.world_size, worker, layout.num_workers, plan)
    seed = worker_seed(plan.seed, epoch, rank, worker, pass_index)
    return WorkerPlan(tuple(pieces), seed, taken * layout.batch_size)


def pass_batches(sequence: Sequence[Piece], layout: Layout, plan: PlanOptions) -> int:
    """Batches every rank yields in a pass over ``sequence``."""
    total = sum(piece.num_samples for piece in sequence)
    per_rank = samples_per_rank(total, layout.world_size, plan.policy)
    return -(-per_rank // layout.batch_size)


def last_worker(sequence: Sequence[Piece], layout: Layout, plan: PlanOptions) -> int:
    """The worker that yields the last batch of a pass (workers take turns, skipping ends)."""
    plan = dataclasses.replace(plan, batch_size=layout.batch_size)
    total = sum(piece.num_samples for piece in sequence)
    per_rank = samples_per_rank(total, layout.world_size, plan.policy)
    counts = worker_batch_counts(per_rank, layout.num_workers, plan)
    turn = (next_worker(counts, sum(counts)) - 1) % layout.num_workers
    while counts[turn] == 0:  # the turn after the last batch skips exhausted workers
        turn = (turn - 1) % layout.num_workers
    return turn


def plan_whole_shards_worker(
    num_shards: int,
    epoch: int,
    history: Sequence[PassRecord],
    rank: int,
    worker: int,
    layout: Layout,
    plan: PlanOptions,
    consumed: int = 0,
    rotate: bool = True,
) -> WorkerPlan:
    """:func:`plan_pass_worker` for sources without a manifest: whole shards, same layout.

    Counts are unknown, so a resume assumes no worker ran out before the resume point, and an
    epoch cannot continue at another layout.

    Raises:
        ConfigError: ``history`` is not empty (a restart at another layout).
    """
    if history:
        raise ConfigError(
            "cannot continue this epoch with another world size, worker count or batch size: "
            "the source has no manifest, so the samples already read cannot be known"
        )
    taken = consumed
    if rotate:
        counts = [consumed + 1] * layout.num_workers
        worker = (worker + next_worker(counts, consumed)) % layout.num_workers
        taken = batches_consumed_per_worker(counts, consumed)[worker]
    pieces = plan_whole_shards(
        num_shards, epoch, rank, layout.world_size, worker, layout.num_workers, plan
    )
    seed = worker_seed(plan.seed, epoch, rank, worker, 0)
    return WorkerPlan(tuple(pieces), seed, taken * plan.batch_size)
