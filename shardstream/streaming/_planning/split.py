"""Splitting a pass into equal rank parts, worker streams and steps: integer arithmetic only.

A *pass* reads a virtual sequence of ``L`` samples (an epoch, or what is left of one) with a
*plan layout* ``(W ranks, N workers per rank, batch b)``:

1. The sequence is cut into ``W`` equal parts of ``P`` samples. ``"pad"`` rounds up and wraps
   around to the start (every sample at least once, fewer than ``W`` twice); ``"drop"`` rounds
   down (fewer than ``W`` left out); ``"mask"`` pads as ``"pad"`` does but marks the wrapped
   positions as *fillers* (real samples read again, so shapes never differ, that an evaluation
   leaves out: every sample exactly once over all ranks, see :meth:`Shape.real_end`).
2. A rank's part is cut into *units* of ``D`` samples, a multiple of ``b``; unit ``j`` goes to
   worker stream ``j % N``. Every rank has the same part length, so every rank has the same
   counts, and only the stream holding the part's last unit ends on a short batch. The units
   are also grouped into ``num_open`` *lanes* of consecutive units: a stream reads from all
   lanes at once (see :mod:`.windows`), so it mixes samples from all over the part.
3. Steps: the rank's batches come from its ``N`` streams in turn, skipping streams that have
   run out (as a DataLoader asks its workers). Step ``t`` of every rank is the same *phase*
   (stream number) and micro-batch, so the ranks' batches of one step form one global batch.

Counts per stream are non-increasing in the stream number, so the turn order is a prefix of
the streams in every round and each question here is answered in ``O(N)``, whatever ``L``.

Which steps a DataLoader worker serves, and which stream slices each step reads.

A pass is planned for a *plan layout* (:class:`~.split.Layout`: ``W`` ranks, ``N`` streams per
rank, micro-batch ``b``). It is read by a *physical layout*: ``W'`` ranks with ``N'``
DataLoader workers each, where ``W'`` divides ``W``. Physical rank ``r`` reads plan ranks
``r * W / W'`` up to the next rank's, so each of its batches is the concatenation of those plan
ranks' micro-batches of one step, and the ranks' batches of one step together are the plan's
global batch, whatever ``W'`` (the same global batches at any world size).

A DataLoader asks its workers in turn, so the ``i``-th batch of a pass that starts at step
``T0`` is served by worker ``i % N'``: worker ``w`` serves steps ``T0 + w, T0 + w + N', ...``.
Every step is a closed-form slice of its streams (:mod:`.windows`), so which worker serves it
only decides who reads it: with ``N'`` dividing ``N`` each worker reads its own streams front
to back, except for a few steps at the end of an epoch.

Plans for shards of unknown length (no manifest): whole shards dealt to workers.

Without counts nothing can be split exactly: slot ``k`` of the epoch's shard order goes to the
``k % (world_size * num_workers)``-th (rank, worker) pair, ranks may get different numbers of
samples, and a worker gets no shard at all when there are fewer shards than ranks x workers.
Each worker interleaves its shards and shuffles them through a bounded buffer (at run time:
:mod:`shardstream.streaming._worker.pipeline`); a resume reads and drops what was consumed.
Indexing the shards (``shardstream index``) gives them a manifest and every guarantee of counted
datasets."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator

import numpy as np

from shardstream.errors import ConfigError
from shardstream.streaming._planning.order import PlanOptions
from shardstream.streaming._planning.sequence import PassSequence, last_at_most, shard_order

__all__ = [
    "Layout",
    "PassPlan",
    "Shape",
    "StepRead",
    "WholeShardPlan",
    "plan_ranks",
    "plan_whole_shards",
    "role_after",
    "samples_per_rank",
    "steps_of_worker",
]


@dataclasses.dataclass(frozen=True)
class Layout:
    """Ranks, DataLoader workers per rank, and samples per batch of each rank."""

    world_size: int
    num_workers: int
    batch_size: int

    def __post_init__(self) -> None:
        if min(self.world_size, self.num_workers, self.batch_size) < 1:
            raise ConfigError(f"a layout needs positive sizes, got {self}")


def samples_per_rank(num_samples: int, world_size: int, policy: str = "pad") -> int:
    """Samples every rank yields per pass: ``ceil`` (pad, mask) or ``floor`` (drop) of N / world."""
    if policy == "drop":
        return num_samples // world_size
    return -(-num_samples // world_size)


def _unit_size(per_rank: int, num_streams: int, batch: int, block_size: int) -> int:
    """A multiple of the batch size, small enough that every stream gets data."""
    full_batches_per_stream = per_rank // batch // num_streams
    wanted = min(-(-block_size // batch), full_batches_per_stream)
    return batch * max(1, wanted)


@dataclasses.dataclass(frozen=True)
class Shape:
    """The integer layout of one pass: parts, units, streams, windows and steps.

    Attributes:
        length: Samples in the pass's sequence (``L``).
        layout: The plan layout.
        per_rank: Samples per rank part (``P``).
        unit: Samples per unit (``D``, a multiple of the batch size).
        lanes: Lanes of the part (at most ``num_open``).
        lane_units: Units per lane (the last lane may have fewer).
        piece_size: Samples a stream takes from each lane per window.
        stream_samples: Samples of each of the ``N`` streams (non-increasing).
        stream_batches: Batches of each stream.
        masked: The wrapped positions are fillers (``"mask"``), not repeats (``"pad"``).

    Examples:
        >>> shape = Shape.of(100, Layout(2, 2, 8), PlanOptions(block_size=16))
        >>> shape.per_rank, shape.unit, shape.stream_samples.tolist(), shape.steps
        (50, 16, [32, 18], 7)
    """

    length: int
    layout: Layout
    per_rank: int
    unit: int
    lanes: int
    lane_units: int
    piece_size: int
    stream_samples: np.ndarray
    stream_batches: np.ndarray
    masked: bool = False

    @classmethod
    def of(cls, length: int, layout: Layout, options: PlanOptions) -> Shape:
        """The shape of a pass over ``length`` samples."""
        per_rank = samples_per_rank(length, layout.world_size, options.policy)
        streams, batch = layout.num_workers, layout.batch_size
        unit = _unit_size(per_rank, streams, batch, options.block_size)
        num_units = -(-per_rank // unit)
        lane_units = max(1, -(-num_units // options.num_open))
        lanes = -(-num_units // lane_units)
        phases = np.arange(streams, dtype=np.int64)
        units = np.maximum(0, -(-(num_units - phases) // streams))
        samples = units * unit
        if num_units:
            samples[(num_units - 1) % streams] -= num_units * unit - per_rank  # the short unit
        batches = -(-samples // batch)
        piece = options.piece_size
        if options.chunk_size > 0 and lanes:
            # Fewer lanes than asked for (a small part): longer pieces keep the window at
            # about num_open * piece_size samples, so it still mixes that many. (Whole-shard
            # orders, chunk_size=0, keep the pieces of the whole-shard order, whose states resume.)
            piece *= max(1, options.num_open // lanes)
        return cls(
            length, layout, per_rank, unit, lanes, lane_units, piece, samples, batches,
            options.policy == "mask",
        )  # fmt: skip

    @property
    def steps(self) -> int:
        """Batches every rank yields in the pass."""
        return int(self.stream_batches.sum())

    def _round(self, step: int) -> tuple[int, int]:
        """``(round, index)`` of a step: in round ``r`` the streams with > ``r`` batches go."""
        batches = self.stream_batches

        def steps_before(round_: int) -> int:
            return int(np.minimum(batches, round_).sum())

        found = last_at_most(steps_before, step, 0, int(batches[0]) if len(batches) else 0)
        return found, step - steps_before(found)

    def step(self, step: int) -> tuple[int, int]:
        """``(stream, micro-batch number)`` that every rank reads at ``step``."""
        if not 0 <= step < self.steps:
            raise IndexError(f"step {step} of a pass of {self.steps} steps")
        return self._round(step)[::-1]

    def consumed_batches(self, steps: int) -> np.ndarray:
        """Batches of each stream that the first ``steps`` steps took."""
        steps = min(max(0, steps), self.steps)
        round_, index = self._round(steps)
        taken = round_ + (np.arange(len(self.stream_batches)) < index)
        return np.minimum(self.stream_batches, taken)

    def consumed_samples(self, steps: int) -> np.ndarray:
        """Samples of each stream that the first ``steps`` steps took."""
        taken = self.consumed_batches(steps) * self.layout.batch_size
        return np.minimum(self.stream_samples, taken)

    def real_end(self, rank: int) -> int:
        """Rank-part positions of ``rank`` before its first filler (``per_rank`` if none).

        With ``"mask"``, part position ``p`` of rank ``r`` is a filler when ``r * P + p`` is past
        the sequence's end: it wrapped around to a sample some rank reads at its real place.

        Examples:
            >>> shape = Shape.of(10, Layout(4, 1, 1), PlanOptions(policy="mask"))
            >>> [shape.real_end(rank) for rank in range(4)]
            [3, 3, 3, 1]
        """
        if not self.masked:
            return self.per_rank
        return min(self.per_rank, max(0, self.length - rank * self.per_rank))

    @property
    def num_units(self) -> int:
        """Units of a rank part."""
        return -(-self.per_rank // self.unit)


@dataclasses.dataclass(frozen=True)
class PassPlan:
    """One pass: what it reads, how it is laid out, and where it sits in its epoch.

    Attributes:
        sequence: The pass's samples in order.
        shape: The integer layout for the plan layout.
        options: Seed, shuffle, policy and sizes.
        epoch: The epoch.
        pass_index: Passes of this epoch before this one.
    """

    sequence: PassSequence
    shape: Shape
    options: PlanOptions
    epoch: int
    pass_index: int

    @property
    def layout(self) -> Layout:
        """The plan layout."""
        return self.shape.layout

    @property
    def steps(self) -> int:
        """Batches every rank yields in the pass."""
        return self.shape.steps


@dataclasses.dataclass(frozen=True)
class StepRead:
    """Positions ``[start, stop)`` of stream ``phase`` of plan rank ``rank``."""

    rank: int
    phase: int
    start: int
    stop: int


def plan_ranks(plan_world_size: int, world_size: int, rank: int) -> range:
    """The plan ranks that physical ``rank`` of ``world_size`` reads.

    Raises:
        ConfigError: ``world_size`` does not divide the plan's world size.
    """
    if plan_world_size % world_size:
        raise ConfigError(
            f"a pass planned for {plan_world_size} ranks cannot be read by {world_size} ranks "
            "(the world size must divide it)"
        )
    share = plan_world_size // world_size
    return range(rank * share, (rank + 1) * share)


def steps_of_worker(
    shape: Shape, first: int, worker: int, num_workers: int, ranks: range
) -> Iterator[tuple[int, list[StepRead]]]:
    """The steps worker ``worker`` of ``num_workers`` serves from step ``first`` on, with reads.

    Examples:
        >>> shape = Shape.of(40, Layout(1, 2, 4), PlanOptions(block_size=4))
        >>> [(step, [(r.phase, r.start) for r in reads])
        ...  for step, reads in steps_of_worker(shape, 0, 1, 2, range(1))][:3]
        [(1, [(1, 0)]), (3, [(1, 4)]), (5, [(1, 8)])]
    """
    batches = shape.stream_batches.tolist()
    descending = [-count for count in batches]  # ascending, for bisect
    samples, batch = shape.stream_samples.tolist(), shape.layout.batch_size
    step = first + worker
    if step >= shape.steps:
        return
    index, round_ = shape.step(step)
    while step < shape.steps:
        start = round_ * batch
        stop = min(start + batch, samples[index])
        yield step, [StepRead(rank, index, start, stop) for rank in ranks]
        step, index = step + num_workers, index + num_workers
        active = bisect.bisect_left(descending, -round_)  # streams with > round_ batches
        while index >= active and step < shape.steps:
            index -= active
            round_ += 1
            active = bisect.bisect_left(descending, -round_)


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
