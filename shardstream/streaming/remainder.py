"""What an epoch has left after a restart, at any world size and worker count. Torch-free.

An epoch is read in one or more *passes*. The first pass covers the epoch's virtual sequence
(:func:`~shardstream.streaming.split.epoch_sequence`) with the layout the job started with:
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

from shardstream.streaming.interleave import Interleave
from shardstream.streaming.shuffle import ShuffleBuffer
from shardstream.streaming.split import (
    Piece,
    PlanOptions,
    batches_consumed_per_worker,
    epoch_sequence,
    next_worker,
    plan_worker_in,
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
    "consumed_samples",
    "last_worker",
    "pass_batches",
    "pass_sequence",
    "plan_pass_worker",
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
    pieces: Sequence[Piece], seed: Sequence[int], stage: StageOptions, count: int
) -> Iterator[tuple[int, int]]:
    """The first ``count`` samples ``(shard, index)`` a worker yields, found without reading."""
    lengths = [piece.num_samples for piece in pieces]
    stages = build_stages(lengths, lambda p, a, b: itertools.repeat(None, b - a), seed, stage)
    for (number, ordinal), _ in itertools.islice(iter(stages), count):
        piece = pieces[number]
        yield piece.shard, piece.start + ordinal


def consumed_samples(
    sequence: Sequence[Piece],
    record: PassRecord,
    epoch: int,
    pass_index: int,
    plan: PlanOptions,
    stage: StageOptions,
) -> Iterator[tuple[int, int]]:
    """Every ``(shard, index)`` the ranks consumed in a pass over ``sequence`` (repeats too)."""
    layout = record.layout
    plan = dataclasses.replace(plan, batch_size=layout.batch_size)
    total = sum(piece.num_samples for piece in sequence)
    per_rank = samples_per_rank(total, layout.world_size, plan.policy)
    batch_counts = worker_batch_counts(per_rank, layout.num_workers, plan)
    sample_counts = worker_sample_counts(per_rank, layout.num_workers, plan)
    taken = batches_consumed_per_worker(batch_counts, record.consumed_batches)
    for rank in range(layout.world_size):
        for worker in range(layout.num_workers):
            count = min(taken[worker] * layout.batch_size, sample_counts[worker])
            if count == 0:
                continue
            pieces = plan_worker_in(
                sequence, rank, layout.world_size, worker, layout.num_workers, plan
            )
            seed = worker_seed(plan.seed, epoch, rank, worker, pass_index)
            yield from _replay(pieces, seed, stage, count)


def pass_sequence(
    counts: Sequence[int],
    epoch: int,
    history: Sequence[PassRecord],
    plan: PlanOptions,
    stage: StageOptions,
) -> list[Piece]:
    """The virtual sequence of the pass that follows ``history`` within ``epoch``.

    With no history it is the whole epoch. Otherwise it is every sample of the last pass's
    sequence that no pass consumed, as runs of consecutive samples in the epoch's order.

    Example:
        >>> plan, stage = PlanOptions(shuffle=False), StageOptions(False, 1, 1)
        >>> first = PassRecord(Layout(1, 1, 2), consumed_batches=1)
        >>> pass_sequence([3, 2], 0, [first], plan, stage)
        [Piece(shard=0, start=2, stop=3), Piece(shard=1, start=0, stop=2)]
    """
    sequence = epoch_sequence(counts, epoch, plan)
    if not history:
        return sequence
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    left = np.zeros(int(offsets[-1]), dtype=bool)
    for piece in sequence:
        left[offsets[piece.shard] + piece.start : offsets[piece.shard] + piece.stop] = True
    for index, record in enumerate(history):
        pass_pieces = sequence if index == 0 else _runs(sequence, left, offsets)
        for shard, ordinal in consumed_samples(pass_pieces, record, epoch, index, plan, stage):
            left[offsets[shard] + ordinal] = False
    return _runs(sequence, left, offsets)


def _runs(sequence: Sequence[Piece], left: np.ndarray, offsets: np.ndarray) -> list[Piece]:
    """The samples still ``left``, as runs in the order of ``sequence``."""
    runs: list[Piece] = []
    for piece in sequence:
        base = int(offsets[piece.shard])
        mask = left[base + piece.start : base + piece.stop].astype(np.int8)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask, [0]])))
        for begin, end in zip(edges[::2], edges[1::2], strict=True):
            runs.append(Piece(piece.shard, piece.start + int(begin), piece.start + int(end)))
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
