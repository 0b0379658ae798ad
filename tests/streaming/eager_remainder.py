"""The remainder of a pass as earlier releases computed it, eagerly: the lazy one's oracle.

A state saved after an elastic restore names its earlier passes; the pass it continues must be
the same sequence, range for range, as the one it was saved in (else its consumed steps name
other samples). This copy of the old code, which walked every rank, stream and lane, lets the
tests check that :class:`~shardstream.streaming._planning.leftover.LeftSequence` keeps that order.
"""

from __future__ import annotations

import dataclasses

from shardstream.streaming._planning.leftover import PassRecord
from shardstream.streaming._planning.order import PlanOptions
from shardstream.streaming._planning.sequence import PassSequence
from shardstream.streaming._planning.split import Shape
from shardstream.streaming._planning.windows import (
    StreamId,
    StreamLanes,
    build_window,
    part_base_ranges,
)


def _stream_left(sequence, shape, options, stream, consumed, ranges):  # type: ignore[no-untyped-def]
    lanes = StreamLanes(shape, stream.phase)
    index = lanes.window_at(consumed)
    offset = consumed - lanes.before(index)
    piece, unit = shape.piece_size, shape.unit
    free_from = [min(length, index * piece) for length in lanes.lengths.tolist()]
    if offset:
        window = build_window(sequence, shape, options, stream, index)
        taken = window.taken_per_run(offset).tolist()
        for run, done in zip(window.runs, taken, strict=True):
            ranges.append((run.position + done, run.position + run.num_samples))
        free_from = [min(length, (index + 1) * piece) for length in lanes.lengths.tolist()]
    first_units = []
    for lane, (start, length) in enumerate(zip(free_from, lanes.lengths.tolist(), strict=True)):
        aligned = min(length, -(-start // unit) * unit)
        for first, end in lanes.rank_ranges(lane, start, aligned):
            ranges.extend(_part_to_base(sequence, shape, stream.rank, first, end))
        count = -(-aligned // unit)
        first_units.append(int(lanes.first_units[lane]) + count * shape.layout.num_workers)
    return first_units


def _rank_left(sequence, shape, options, rank, consumed):  # type: ignore[no-untyped-def]
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
            for unit in range(frontier[lane], common, streams):
                ranges.extend(_units_to_base(sequence, shape, rank.rank, unit, unit + 1))
        ranges.extend(_units_to_base(sequence, shape, rank.rank, common, end))
    return ranges


def _units_to_base(sequence, shape, rank, first, end):  # type: ignore[no-untyped-def]
    start, stop = first * shape.unit, min(end * shape.unit, shape.per_rank)
    return _part_to_base(sequence, shape, rank, start, stop)


def _part_to_base(sequence, shape, rank, start, stop):  # type: ignore[no-untyped-def]
    if start >= stop:
        return []
    return part_base_ranges(sequence, shape, rank, start, stop)


def eager_remainder(
    sequence: PassSequence, record: PassRecord, epoch: int, pass_index: int, options: PlanOptions
) -> list[tuple[int, int]]:
    """The old remainder's base ranges, touching neighbours joined (its RangeSequence's)."""
    shape = Shape.of(sequence.length, record.layout, options)
    consumed = shape.consumed_samples(record.consumed_steps)
    ranges: list[tuple[int, int]] = []
    for rank in range(record.layout.world_size):
        stream = StreamId(epoch, pass_index, rank, 0)
        ranges.extend(_rank_left(sequence, shape, options, stream, consumed))
    dropped = record.layout.world_size * shape.per_rank
    ranges.extend(sequence.base_ranges(dropped, sequence.length))
    joined: list[tuple[int, int]] = []
    for first, end in ranges:
        if first >= end:
            continue
        if joined and joined[-1][1] == first:
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((first, end))
    return joined


def clipped(ranges: list[tuple[int, int]], start: int, stop: int) -> list[tuple[int, int]]:
    """Positions ``[start, stop)`` of ``ranges`` laid end to end, as ranges (the old
    sequence's answer: split where its stored ranges split)."""
    pieces, offset = [], 0
    for first, end in ranges:
        low, high = max(start, offset), min(stop, offset + end - first)
        if low < high:
            pieces.append((first + low - offset, first + high - offset))
        offset += end - first
    return pieces
