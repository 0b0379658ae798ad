"""What an epoch has left after a restart, at any world size and worker count.

An epoch is read in one or more *passes*. A pass reads a sequence (the whole epoch, or what an
earlier pass left) with a *plan layout* (:class:`~shardstream.streaming.planning.split.Layout`)
and is described by a :class:`PassRecord` once it ends early: the plan layout and the steps
every rank consumed (ranks step together, so the count is the same on every rank).

Which samples those steps held follows from the plan alone (:mod:`.windows`): each stream
consumed whole windows, a prefix of each of its sub-lanes, and then a prefix of one window's
order, a prefix of each of that window's runs. What is left is therefore a short list of ranges
of the epoch's sequence: per rank and lane one range, plus a few units where the streams'
frontiers differ and one window's run suffixes per stream. Its cost grows with ranks x streams
x lanes, never with the samples.

The next pass plans that list like a whole epoch (equal parts per rank, ``pad``/``drop``), so
every rank again gets the same number of batches. Positions, not samples, are what is left: a
sample that the pass would have read twice (a ``pad`` repeat, a mixture that repeats a small
stream) and that was read once is still left once. A ``mask`` filler is not a position of the
sequence, so it is never left: with ``mask`` every sample comes exactly once across restarts.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from shardstream.streaming.planning.sequence import (
    BaseSequence,
    PassSequence,
    RangeSequence,
    base_of,
    base_ranges,
)
from shardstream.streaming.planning.split import Layout, PlanOptions, Shape
from shardstream.streaming.planning.windows import (
    StreamId,
    StreamLanes,
    build_window,
    pass_ranges,
)

__all__ = ["PassRecord", "pass_sequence", "remainder"]


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """A finished part of an epoch: its plan layout, and the steps each rank consumed in it."""

    layout: Layout
    consumed_steps: int

    def as_dict(self) -> dict[str, int]:
        """Plain values for a state dict."""
        return {**self.layout.as_dict(), "consumed_steps": self.consumed_steps}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PassRecord:
        """Inverse of :meth:`as_dict`."""
        layout = Layout(int(data["world_size"]), int(data["num_workers"]), int(data["batch_size"]))
        return cls(layout, int(data["consumed_steps"]))


def _stream_left(
    sequence: PassSequence,
    shape: Shape,
    options: PlanOptions,
    stream: StreamId,
    consumed: int,
    ranges: list[tuple[int, int]],
) -> list[int]:
    """Add a stream's partly consumed base ranges; return per lane its first free unit.

    The stream consumed whole windows, that is a prefix of every sub-lane, then a prefix of
    one window's order, that is a prefix of each of that window's runs.
    """
    lanes = StreamLanes(shape, stream.phase)
    index = lanes.window_at(consumed)
    offset = consumed - lanes.before(index)
    piece, unit = shape.piece_size, shape.unit
    free_from = [min(length, index * piece) for length in lanes.lengths.tolist()]
    if offset:
        window = build_window(sequence, shape, options, stream, index)
        taken = window.taken_per_run(offset).tolist()
        for run, done, filler in zip(window.runs, taken, window.fillers.tolist(), strict=True):
            if not filler:  # a "mask" filler is no sample of the epoch: nothing is left of it
                ranges.append((run.position + done, run.position + run.num_samples))
        free_from = [min(length, (index + 1) * piece) for length in lanes.lengths.tolist()]
    first_units = []
    for lane, (start, length) in enumerate(zip(free_from, lanes.lengths.tolist(), strict=True)):
        aligned = min(length, -(-start // unit) * unit)  # the rest of a partly taken unit
        for first, end in lanes.rank_ranges(lane, start, aligned):
            ranges.extend(_part_to_base(sequence, shape, stream.rank, first, end))
        count = -(-aligned // unit)
        first_units.append(int(lanes.first_units[lane]) + count * shape.layout.num_workers)
    return first_units


def _rank_left(
    sequence: PassSequence,
    shape: Shape,
    options: PlanOptions,
    rank: StreamId,
    consumed: np.ndarray,
) -> list[tuple[int, int]]:
    """Base ranges of one rank part that the pass did not consume.

    Per lane, every stream's free units form a suffix of its sub-lane; across streams they
    form one range of the lane, except a few units where the streams' frontiers differ.
    """
    streams = shape.layout.num_workers
    ranges: list[tuple[int, int]] = []
    frontiers = []
    for phase, taken in enumerate(consumed.tolist()):
        stream = dataclasses.replace(rank, phase=phase)
        frontiers.append(_stream_left(sequence, shape, options, stream, int(taken), ranges))
    for lane in range(shape.lanes):
        end = min((lane + 1) * shape.lane_units, shape.num_units)
        common = max(min(frontier[lane], end) for frontier in frontiers)
        for frontier in frontiers:
            for unit in range(frontier[lane], common, streams):  # this stream's, before it
                ranges.extend(_units_to_base(sequence, shape, rank.rank, unit, unit + 1))
        ranges.extend(_units_to_base(sequence, shape, rank.rank, common, end))
    return ranges


def _units_to_base(
    sequence: PassSequence, shape: Shape, rank: int, first: int, end: int
) -> list[tuple[int, int]]:
    start, stop = first * shape.unit, min(end * shape.unit, shape.per_rank)
    return _part_to_base(sequence, shape, rank, start, stop)


def _part_to_base(
    sequence: PassSequence, shape: Shape, rank: int, start: int, stop: int
) -> list[tuple[int, int]]:
    stop = min(stop, shape.real_end(rank))  # "mask" fillers are not left: never samples
    if start >= stop:
        return []
    return [
        base_range
        for first, end in pass_ranges(shape, rank, start, stop)
        for base_range in base_ranges(sequence, first, end)
    ]


def remainder(
    sequence: PassSequence,
    record: PassRecord,
    epoch: int,
    pass_index: int,
    options: PlanOptions,
) -> RangeSequence:
    """What a pass over ``sequence`` left after ``record.consumed_steps`` steps.

    Example:
        >>> from shardstream.streaming.planning.sequence import ShardSequence
        >>> options = PlanOptions(shuffle=False, block_size=2, piece_size=2)
        >>> sequence = ShardSequence(np.array([3, 2]), np.array([0, 1]))
        >>> left = remainder(sequence, PassRecord(Layout(1, 1, 2), 1), 0, 0, options)
        >>> left.length, [tuple(run)[:3] for run in left.locate(0, left.length)]
        (3, [(0, 2, 3), (1, 0, 2)])
    """
    shape = Shape.of(sequence.length, record.layout, options)
    consumed = shape.consumed_samples(record.consumed_steps)
    ranges: list[tuple[int, int]] = []
    for rank in range(record.layout.world_size):
        stream = StreamId(epoch, pass_index, rank, 0)
        ranges.extend(_rank_left(sequence, shape, options, stream, consumed))
    dropped = record.layout.world_size * shape.per_rank
    ranges.extend(base_ranges(sequence, dropped, sequence.length))  # what "drop" left out
    return _merged(base_of(sequence), ranges)


def _merged(base: BaseSequence, ranges: list[tuple[int, int]]) -> RangeSequence:
    """A range sequence with touching neighbours joined (a restart's list stays short)."""
    starts: list[int] = []
    stops: list[int] = []
    for first, end in ranges:
        if first >= end:
            continue
        if stops and stops[-1] == first:
            stops[-1] = end
        else:
            starts.append(first)
            stops.append(end)
    return RangeSequence(base, np.array(starts, dtype=np.int64), np.array(stops, dtype=np.int64))


def pass_sequence(
    base: BaseSequence, epoch: int, history: list[PassRecord], options: PlanOptions
) -> PassSequence:
    """The sequence of the pass that follows ``history`` within ``epoch`` (``base`` if none)."""
    sequence: PassSequence = base  # type: ignore[assignment]
    for index, record in enumerate(history):
        sequence = remainder(sequence, record, epoch, index, options)
    return sequence
