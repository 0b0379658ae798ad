"""What a pass left, as a sequence computed where it is read: nothing per rank up front.

A pass that ends early consumed, per stream, a count of samples that is the same on every rank
(ranks step together). In rank-part coordinates, what a stream consumed is therefore the same
on every rank: whole windows (a prefix of each of its sub-lanes), then a prefix of one window's
order (see :mod:`.windows`). Only that one window's order depends on the rank (it is seeded per
stream), and only through which run each of its outputs comes from.

So every rank part leaves the same number of positions ``Q``, laid out by one *template*
shared by all ranks: per stream, the run suffixes of its partly read window (a placeholder,
filled per rank) and the rest of each lane's partly taken unit; then, per lane, the units that
the streams' frontiers leave. Rank ``r``'s leftovers are positions ``[r * Q, (r + 1) * Q)`` of
the sequence, and ``drop``'s tail follows. The template costs ``O(streams x lanes)``, once; a
position is found by two divisions and a binary search, and a rank's partly read window is
built only when a position inside it is asked for: a rank after a restore pays for the few old
ranks its own part covers, whatever the number of ranks or samples.

With ``"mask"``, the last ranks' parts end in fillers (positions past the sequence's end, read
but not counted), which are never left: those few ranks leave less, counted at construction
(each needs its own clipped entries and the filler runs of its windows dropped).

The order is that of the list of ranges earlier releases stored (rank by rank, stream by
stream, lane by lane), so states saved after a restore continue exactly.

What an epoch has left after a restart, at any world size and worker count.

An epoch is read in one or more *passes*. A pass reads a sequence (the whole epoch, or what an
earlier pass left) with a *plan layout* (:class:`~shardstream.streaming._planning.split.Layout`)
and is described by a :class:`PassRecord` once it ends early: the plan layout and the steps
every rank consumed (ranks step together, so the count is the same on every rank).

Which samples those steps held follows from the plan alone (:mod:`.windows`): each stream
consumed whole windows, a prefix of each of its sub-lanes, and then a prefix of one window's
order, a prefix of each of that window's runs. What is left is a
:class:`~.leftover.LeftSequence`: one template of a rank part's leftovers, shared by every
rank, and per rank its partly read windows, built only where a later pass reads them. Its
cost grows with streams x lanes, never with the ranks or the samples.

The next pass plans that list like a whole epoch (equal parts per rank, ``pad``/``drop``), so
every rank again gets the same number of batches. Positions, not samples, are what is left: a
sample that the pass would have read twice (a ``pad`` repeat, a mixture that repeats a small
stream) and that was read once is still left once. A ``mask`` filler is not a position of the
sequence, so it is never left: with ``mask`` every sample comes exactly once across restarts."""

from __future__ import annotations

import bisect
import collections
import contextlib
import dataclasses

import numpy as np

from shardstream.streaming._planning.order import PlanOptions
from shardstream.streaming._planning.sequence import BaseSequence, DerivedSequence, PassSequence
from shardstream.streaming._planning.split import Layout, Shape
from shardstream.streaming._planning.windows import (
    StreamId,
    StreamLanes,
    build_window,
    part_base_ranges,
)

__all__ = [
    "LeftSequence",
    "PassRecord",
    "RankTemplate",
    "pass_sequence",
    "rank_template",
    "remainder",
]


_WINDOWS_KEPT = 256  # partly read windows kept per pass (a rank needs a few ranks' streams)


@dataclasses.dataclass(frozen=True)
class RankTemplate:
    """What every rank part of a pass left, in rank-part positions.

    Attributes:
        streams: Per entry, the stream whose partly read window it stands for, or -1 for
            rank-part positions ``[firsts[i], firsts[i] + size)``.
        firsts: Per entry, its first rank-part position (unused for windows).
        offsets: Where each entry starts among the rank's leftovers, and their total last.
        windows: Per stream with a partly read window, ``(window, outputs read)``.
    """

    streams: list[int]
    firsts: list[int]
    offsets: list[int]
    windows: dict[int, tuple[int, int]]

    @property
    def length(self) -> int:
        """Positions each rank part left (``Q``)."""
        return self.offsets[-1]


class _Builder:
    """Entries in order, neighbours that touch joined."""

    def __init__(self) -> None:
        self.streams: list[int] = []
        self.firsts: list[int] = []
        self.offsets: list[int] = [0]

    def add(self, stream: int, first: int, size: int) -> None:
        if size <= 0:
            return
        last = self.firsts[-1] + self.offsets[-1] - self.offsets[-2] if self.streams else -1
        if stream < 0 and self.streams and self.streams[-1] < 0 and last == first:
            self.offsets[-1] += size
            return
        self.streams.append(stream)
        self.firsts.append(first)
        self.offsets.append(self.offsets[-1] + size)


def rank_template(shape: Shape, consumed: np.ndarray) -> RankTemplate:
    """The template of what each rank part left after its streams consumed ``consumed``.

    Examples:
        >>> from shardstream.streaming._planning.split import Layout
        >>> shape = Shape.of(40, Layout(1, 2, 2), PlanOptions(block_size=2, piece_size=2))
        >>> template = rank_template(shape, shape.consumed_samples(3))
        >>> template.length, template.windows
        (34, {0: (0, 4), 1: (0, 2)})
    """
    builder = _Builder()
    windows: dict[int, tuple[int, int]] = {}
    streams, unit = shape.layout.num_workers, shape.unit
    frontiers = np.zeros((streams, shape.lanes), dtype=np.int64)
    for phase, taken in enumerate(consumed.tolist()):
        lanes = StreamLanes(shape, phase)
        index = lanes.window_at(int(taken))
        offset = int(taken) - lanes.before(index)
        if offset:  # its run suffixes come first, then what the next windows hold
            windows[phase] = (index, offset)
            builder.add(phase, 0, lanes.window_size(index) - offset)
            index += 1
        free = np.minimum(lanes.lengths, index * shape.piece_size)
        aligned = np.minimum(lanes.lengths, -(-free // unit) * unit)
        number, within = np.divmod(free, unit)
        begins = (lanes.first_units + number * streams) * unit + within
        for begin, size in zip(begins.tolist(), (aligned - free).tolist(), strict=True):
            builder.add(-1, begin, size)  # the rest of a partly taken unit
        frontiers[phase] = lanes.first_units + (-(-aligned // unit)) * streams
    _add_free_units(builder, shape, frontiers)
    return RankTemplate(builder.streams, builder.firsts, builder.offsets, windows)


def _add_free_units(builder: _Builder, shape: Shape, frontiers: np.ndarray) -> None:
    """Per lane, each stream's units before the furthest frontier, then the lane's rest."""
    unit, per_rank, streams = shape.unit, shape.per_rank, shape.layout.num_workers
    for lane in range(shape.lanes):
        end = min((lane + 1) * shape.lane_units, shape.num_units)
        column = frontiers[:, lane].tolist()
        common = max(min(frontier, end) for frontier in column)
        for frontier in column:
            for number in range(frontier, common, streams):
                builder.add(-1, number * unit, min(unit, per_rank - number * unit))
        builder.add(-1, common * unit, min(end * unit, per_rank) - common * unit)


class LeftSequence(DerivedSequence):
    """What a pass over ``sequence`` left after its streams consumed ``consumed`` samples.

    Args:
        sequence: The pass's sequence.
        shape: The pass's integer layout.
        options: The plan options.
        stream: Epoch and pass index of the pass (its rank and phase are ignored).
        consumed: Samples each stream consumed (:meth:`.split.Shape.consumed_samples`).

    Examples:
        >>> from shardstream.streaming._planning.sequence import ShardSequence
        >>> from shardstream.streaming._planning.split import Layout
        >>> options = PlanOptions(shuffle=False, block_size=2, piece_size=2)
        >>> sequence = ShardSequence(np.array([3, 2]), np.array([0, 1]))
        >>> shape = Shape.of(5, Layout(1, 1, 2), options)
        >>> left = LeftSequence(sequence, shape, options, StreamId(0, 0, 0, 0), np.array([2]))
        >>> left.length, left.base_ranges(0, left.length)
        (3, [(2, 5)])
    """

    def __init__(
        self,
        sequence: PassSequence,
        shape: Shape,
        options: PlanOptions,
        stream: StreamId,
        consumed: np.ndarray,
    ) -> None:
        self.base = sequence.base
        self._sequence, self._shape, self._options, self._stream = (
            sequence, shape, options, stream,
        )  # fmt: skip
        self.template = rank_template(shape, consumed)
        world = shape.layout.world_size
        self._windows: collections.OrderedDict[tuple[int, int], tuple[list[int], list[int]]] = (
            collections.OrderedDict()
        )
        # Ranks whose parts hold no "mask" filler leave the template's length each; the rest
        # (a few last ranks) leave less: their own entry offsets, made now.
        self._full = world
        if shape.masked and shape.per_rank:
            self._full = min(world, sequence.length // shape.per_rank)
        self._tail: list[list[int]] = [self._rank_offsets(r) for r in range(self._full, world)]
        self._tail_starts = [self._full * self.template.length]
        for offsets in self._tail:
            self._tail_starts.append(self._tail_starts[-1] + offsets[-1])
        self._ranked = self._tail_starts[-1]
        self._kept = world * shape.per_rank  # ``drop`` leaves the sequence's tail from here
        self.length = self._ranked + max(0, sequence.length - self._kept)

    def base_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Positions ``[start, stop)`` as base ranges, touching neighbours joined."""
        pieces: list[tuple[int, int]] = []
        per_rank = self.template.length
        while start < stop:
            if start >= self._ranked:  # drop's tail: the pass's sequence as it was
                first = self._kept + start - self._ranked
                pieces += self._sequence.base_ranges(first, first + stop - start)
                break
            if start < self._tail_starts[0]:
                rank, within = divmod(start, per_rank)
                size = per_rank
            else:  # a rank whose part ends in "mask" fillers
                slot = bisect.bisect_right(self._tail_starts, start) - 1
                rank, within = self._full + slot, start - self._tail_starts[slot]
                size = self._tail_starts[slot + 1] - self._tail_starts[slot]
            take = min(stop - start, size - within)
            pieces += self._rank_ranges(rank, within, within + take)
            start += take
        return _joined(pieces)

    def _rank_offsets(self, rank: int) -> list[int]:
        """Where each template entry starts among ``rank``'s leftovers, and their total last:
        its rank-part entries clipped at its first filler, its windows without filler runs."""
        template, real_end = self.template, self._shape.real_end(rank)
        offsets = [0]
        for slot, phase in enumerate(template.streams):
            if phase < 0:
                first = template.firsts[slot]
                size = template.offsets[slot + 1] - template.offsets[slot]
                offsets.append(offsets[-1] + max(0, min(first + size, real_end) - first))
            else:
                offsets.append(offsets[-1] + self._window_left(rank, phase)[1][-1])
        return offsets

    def _rank_ranges(self, rank: int, start: int, stop: int) -> list[tuple[int, int]]:
        """Leftover positions ``[start, stop)`` of rank part ``rank``, as base ranges."""
        template, pieces = self.template, []
        offsets = template.offsets if rank < self._full else self._tail[rank - self._full]
        slot = bisect.bisect_right(offsets, start) - 1
        while start < stop:
            entry, end = offsets[slot], min(stop, offsets[slot + 1])
            phase = template.streams[slot]
            if end <= start:  # an entry this rank leaves nothing of (all fillers)
                slot += 1
                continue
            if phase < 0:
                first = template.firsts[slot] + start - entry
                stop_at = first + end - start
                pieces += part_base_ranges(self._sequence, self._shape, rank, first, stop_at)
            else:
                pieces += _slice(*self._window_left(rank, phase), start - entry, end - entry)
            start, slot = end, slot + 1
        return pieces

    def _window_left(self, rank: int, phase: int) -> tuple[list[int], list[int]]:
        """The run suffixes that rank ``rank``'s stream ``phase`` left of its partly read
        window: their base starts and their offsets among them (kept for the next asks)."""
        key = (rank, phase)
        found = self._windows.get(key)  # one lookup: a thread loader's threads share the cache
        if found is not None:
            with contextlib.suppress(KeyError):  # dropped by another thread meanwhile
                self._windows.move_to_end(key)
            return found
        index, offset = self.template.windows[phase]
        stream = dataclasses.replace(self._stream, rank=rank, phase=phase)
        window = build_window(self._sequence, self._shape, self._options, stream, index)
        taken = window.taken_per_run(offset)
        firsts = np.fromiter((run.position for run in window.runs), np.int64, len(window.runs))
        sizes = np.fromiter((run.num_samples for run in window.runs), np.int64, len(taken))
        suffixes = np.where(window.fillers, 0, sizes - taken)  # a "mask" filler is never left
        offsets = np.zeros(len(taken) + 1, dtype=np.int64)
        np.cumsum(suffixes, out=offsets[1:])
        left = ((firsts + taken).tolist(), offsets.tolist())
        self._windows[key] = left
        if len(self._windows) > _WINDOWS_KEPT:
            self._windows.popitem(last=False)
        return left


def _slice(firsts: list[int], offsets: list[int], start: int, stop: int) -> list[tuple[int, int]]:
    """Positions ``[start, stop)`` of ranges laid end to end (``firsts``, ``offsets``)."""
    pieces = []
    slot = bisect.bisect_right(offsets, start) - 1
    while start < stop:
        end = min(stop, offsets[slot + 1])
        if end > start:
            first = firsts[slot] + start - offsets[slot]
            pieces.append((first, first + end - start))
        start, slot = max(start, end), slot + 1
    return pieces


def _joined(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``ranges`` with touching neighbours joined: the longest runs of consecutive positions."""
    joined: list[tuple[int, int]] = []
    for first, end in ranges:
        if first >= end:
            continue
        if joined and joined[-1][1] == first:
            joined[-1] = (joined[-1][0], end)
        else:
            joined.append((first, end))
    return joined


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """A finished part of an epoch: its plan layout, and the steps each rank consumed in it."""

    layout: Layout
    consumed_steps: int


def remainder(
    sequence: PassSequence,
    record: PassRecord,
    epoch: int,
    pass_index: int,
    options: PlanOptions,
) -> LeftSequence:
    """What a pass over ``sequence`` left after ``record.consumed_steps`` steps.

    Examples:
        >>> import numpy as np
        >>> from shardstream.streaming._planning.sequence import ShardSequence
        >>> options = PlanOptions(shuffle=False, block_size=2, piece_size=2)
        >>> sequence = ShardSequence(np.array([3, 2]), np.array([0, 1]))
        >>> left = remainder(sequence, PassRecord(Layout(1, 1, 2), 1), 0, 0, options)
        >>> left.length, [tuple(run)[:3] for run in left.locate(0, left.length)]
        (3, [(0, 2, 3), (1, 0, 2)])
    """
    shape = Shape.of(sequence.length, record.layout, options)
    consumed = shape.consumed_samples(record.consumed_steps)
    return LeftSequence(sequence, shape, options, StreamId(epoch, pass_index, 0, 0), consumed)


def pass_sequence(
    base: BaseSequence, epoch: int, history: list[PassRecord], options: PlanOptions
) -> PassSequence:
    """The sequence of the pass that follows ``history`` within ``epoch`` (``base`` if none)."""
    sequence: PassSequence = base
    for index, record in enumerate(history):
        sequence = remainder(sequence, record, epoch, index, options)
    return sequence
