"""The order of one worker stream: windows across lanes, interleaved at random, in closed form.

A rank part is cut into *lanes* of consecutive units (see :class:`~.split.Shape`), each unit
belonging to one stream. A stream's samples in lane ``l`` (its units there, end to end) form
its *sub-lane*. Window ``i`` of a stream takes ``piece_size`` samples from each of its
sub-lanes, positions ``[i * piece_size, (i + 1) * piece_size)``, so one window holds runs
from all over the rank part (shards written in class order still give mixed batches), and
yields them in a seeded random interleave in which every run keeps its own order: stratified
(each run spread evenly over the window at a random phase, so every stretch of as many samples
as the window has runs holds about one of each; :func:`interleave_labels`), or uniformly
random. So every run is read front to back (one ranged read, or
one memory map), and any contiguous slice of a window's order is a prefix-to-suffix slice of
each run.

Nothing here depends on what was read before: the window holding stream position ``k`` and its
order follow from ``k`` and the seeds, which is what makes a resume a skip (no replay), and why
what a pass has consumed is, per sub-lane, a prefix plus at most one window's run prefixes
(:mod:`~shardstream.streaming._planning.leftover`).

Which samples each batch of a pass holds, from the plan alone (no I/O, no processes).

The loader reads exactly this order (the tests compare it with real DataLoader workers), so it
is what ``shardstream bench --shuffle`` and the shuffle-quality benchmark measure: how mixed
the batches are, computed in milliseconds per thousand batches without reading a byte."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from shardstream.streaming._planning.order import PlanOptions
from shardstream.streaming._planning.sequence import PassSequence, Run, last_at_most
from shardstream.streaming._planning.split import PassPlan, Shape

__all__ = [
    "StreamId",
    "StreamLanes",
    "Window",
    "build_window",
    "interleave_labels",
    "part_base_ranges",
    "planned_batches",
    "stream_samples",
    "window_seed",
]


_WINDOW_TAG = 0x1A7E


@dataclasses.dataclass(frozen=True)
class StreamId:
    """One worker stream of a pass: stream ``phase`` of rank part ``rank``.

    Attributes:
        epoch: The epoch.
        pass_index: Passes of this epoch before this one (restarts at another layout).
        rank: The rank part (a plan rank: with a canonical layout, one of several per rank).
        phase: The stream within the rank (a plan worker).
    """

    epoch: int
    pass_index: int
    rank: int
    phase: int


class StreamLanes:
    """Where a stream's samples sit in each lane, and its windows' sizes.

    Args:
        shape: The pass's integer layout.
        phase: The stream.

    Examples:
        >>> from shardstream.streaming._planning.split import Layout
        >>> options = PlanOptions(block_size=2, piece_size=2, num_open=2)
        >>> shape = Shape.of(40, Layout(1, 2, 2), options)
        >>> lanes = StreamLanes(shape, 1)
        >>> lanes.lengths.tolist(), lanes.window_size(0), lanes.rank_ranges(1, 0, 4)
        ([10, 10], 4, [(22, 24), (26, 28)])
    """

    def __init__(self, shape: Shape, phase: int) -> None:
        self.shape, self.phase = shape, phase
        streams, units, per_lane = shape.layout.num_workers, shape.num_units, shape.lane_units
        starts = np.arange(shape.lanes, dtype=np.int64) * per_lane
        ends = np.minimum(starts + per_lane, units)
        self.first_units = starts + (phase - starts) % streams
        counts = np.maximum(0, -(-(ends - self.first_units) // streams))
        self.lengths = counts * shape.unit
        if units and (units - 1) % streams == phase:  # this stream holds the short last unit
            self.lengths[-1] -= units * shape.unit - shape.per_rank
        self.total = int(self.lengths.sum())

    def before(self, window: int) -> int:
        """Stream positions before window ``window`` (the sizes of all earlier windows)."""
        return int(np.minimum(self.lengths, window * self.shape.piece_size).sum())

    def window_size(self, window: int) -> int:
        """Samples in window ``window``."""
        return self.before(window + 1) - self.before(window)

    def window_at(self, position: int) -> int:
        """The window holding stream position ``position``."""
        piece = self.shape.piece_size
        low, high = position // (piece * max(1, self.shape.lanes)), -(-self.total // piece)
        return last_at_most(self.before, position, low, high)

    def rank_ranges(self, lane: int, start: int, stop: int) -> list[tuple[int, int]]:
        """Sub-lane positions ``[start, stop)`` of ``lane`` as rank-part ranges (split at units)."""
        unit, streams = self.shape.unit, self.shape.layout.num_workers
        first = int(self.first_units[lane])
        ranges: list[tuple[int, int]] = []
        while start < stop:
            number, offset = divmod(start, unit)
            take = min(stop - start, unit - offset)
            begin = (first + number * streams) * unit + offset
            ranges.append((begin, begin + take))
            start += take
        return ranges


@dataclasses.dataclass(frozen=True)
class Window:
    """One window of a stream: its runs and the order in which their samples come.

    Attributes:
        index: The window's number in its stream.
        start: Stream position of its first sample.
        runs: Runs of consecutive samples, lane by lane.
        lanes: The lane of each run.
        labels: For each output position, the run it comes from.
        ordinals: For each output position, the sample's number within its run.
        fillers: For each run, whether it holds fillers (``"mask"``: read, but not counted).
    """

    index: int
    start: int
    runs: list[Run]
    lanes: list[int]
    labels: np.ndarray
    ordinals: np.ndarray
    fillers: np.ndarray

    @property
    def num_samples(self) -> int:
        """Samples in the window."""
        return len(self.labels)

    def taken_per_run(self, count: int) -> np.ndarray:
        """How many samples of each run the window's first ``count`` outputs hold."""
        return np.bincount(self.labels[:count], minlength=len(self.runs))


def window_seed(options: PlanOptions, stream: StreamId, window: int) -> list[int]:
    """The seed of one window's order; independent of every other window and of the layout."""
    return [
        options.seed, stream.epoch, stream.pass_index, stream.rank, stream.phase, window,
        _WINDOW_TAG,
    ]  # fmt: skip


def part_base_ranges(
    sequence: PassSequence, shape: Shape, rank: int, start: int, stop: int
) -> list[tuple[int, int]]:
    """Rank-part positions ``[start, stop)`` of plan rank ``rank`` as base-sequence ranges."""
    return [
        ranges
        for first, end in _pass_ranges(shape, rank, start, stop)
        for ranges in sequence.base_ranges(first, end)
    ]


def _pass_ranges(shape: Shape, rank: int, start: int, stop: int) -> list[tuple[int, int]]:
    """Rank-part positions ``[start, stop)`` as pass-sequence ranges (``pad`` wraps around)."""
    position, end, length = (
        rank * shape.per_rank + start,
        rank * shape.per_rank + stop,
        shape.length,
    )
    ranges: list[tuple[int, int]] = []
    while position < end:
        offset = position % length
        take = min(end - position, length - offset)
        ranges.append((offset, offset + take))
        position += take
    return ranges


def _window_runs(
    sequence: PassSequence, shape: Shape, lanes: StreamLanes, rank: int, index: int
) -> tuple[list[Run], list[int], list[int]]:
    """Window ``index``'s runs lane by lane, each run's lane, and which runs are fillers."""
    piece, real_end = shape.piece_size, shape.real_end(rank)
    # The window's rank-part ranges, lane by lane: (lane, first, end, holds fillers).
    parts: list[tuple[int, int, int, bool]] = []
    for lane, length in enumerate(lanes.lengths.tolist()):
        start, stop = index * piece, min((index + 1) * piece, length)
        for first, end in lanes.rank_ranges(lane, start, stop):
            if end > real_end:  # split at the real end: fillers come after it
                if first < real_end:
                    parts.append((lane, first, real_end, False))
                    first = real_end
                parts.append((lane, first, end, True))  # "mask": past the last rank's real end
            else:
                parts.append((lane, first, end, False))
    # Their base ranges, located all at once (a window has hundreds).
    owners: list[int] = []
    ranges: list[tuple[int, int]] = []
    for number, (_, first, end, _) in enumerate(parts):
        found = part_base_ranges(sequence, shape, rank, first, end)
        owners.extend([number] * len(found))
        ranges.extend(found)
    runs: list[Run] = []
    run_lanes: list[int] = []
    filler_runs: list[int] = []
    for owner, located in zip(owners, sequence.base.locate_many(ranges), strict=True):
        lane, _, _, fillers = parts[owner]
        if fillers:
            filler_runs.extend(range(len(runs), len(runs) + len(located)))
        runs.extend(located)
        run_lanes.extend([lane] * len(located))
    return runs, run_lanes, filler_runs


def build_window(
    sequence: PassSequence, shape: Shape, options: PlanOptions, stream: StreamId, index: int
) -> Window:
    """Window ``index`` of ``stream``: its runs and the seeded order of their samples.

    Examples:
        >>> from shardstream.streaming._planning.sequence import ShardSequence
        >>> from shardstream.streaming._planning.split import Layout
        >>> sequence = ShardSequence(np.array([6, 6]), np.array([0, 1]))
        >>> options = PlanOptions(shuffle=False, block_size=4, piece_size=2, num_open=2)
        >>> shape = Shape.of(12, Layout(1, 1, 4), options)
        >>> window = build_window(sequence, shape, options, StreamId(0, 0, 0, 0), 0)
        >>> [tuple(run)[:3] for run in window.runs], window.ordinals.tolist()
        ([(0, 0, 2), (1, 2, 4)], [0, 1, 0, 1])
    """
    lanes = StreamLanes(shape, stream.phase)
    runs, run_lanes, filler_runs = _window_runs(sequence, shape, lanes, stream.rank, index)
    lengths = np.fromiter((run.num_samples for run in runs), np.int64, len(runs))
    labels = np.repeat(np.arange(len(runs), dtype=np.int64), lengths)
    firsts = np.zeros(len(runs), dtype=np.int64)
    np.cumsum(lengths[:-1], out=firsts[1:])
    if options.shuffle and len(runs) > 1:
        rng = np.random.default_rng(window_seed(options, stream, index))
        labels = interleave_labels(lengths, rng, options.interleave)
        order = np.argsort(labels, kind="stable")  # each run's outputs, in output order
        ordinals = np.empty(len(labels), dtype=np.int64)
        ordinals[order] = np.arange(len(labels)) - np.repeat(firsts, lengths)
    else:
        ordinals = np.arange(len(labels), dtype=np.int64) - np.repeat(firsts, lengths)
    fillers = np.zeros(len(runs), dtype=bool)
    fillers[filler_runs] = True
    return Window(index, lanes.before(index), runs, run_lanes, labels, ordinals, fillers)


def interleave_labels(lengths: np.ndarray, rng: np.random.Generator, kind: str) -> np.ndarray:
    """A seeded order of a window's samples: for each output position, the run it comes from.

    Every run keeps its own order either way (the caller numbers each run's outputs in turn).
    ``"uniform"``: a uniformly random permutation of the labels. A batch of ``b`` samples from
    a window of ``r`` equal runs then holds about ``r * (1 - exp(-b / r))`` of them (42 of 73
    for a batch of 64), since some runs come twice and others not at all. ``"stratified"``:
    run ``i``'s ``k``-th sample goes to key ``(k + u) / n_i`` with ``u`` uniform in [0, 1) per
    sample, and the outputs follow the keys. Each run is spread evenly over the window at a
    random phase, so every stretch of ``r`` outputs of equal runs holds one sample of each run,
    in a random order: a batch holds samples of about ``min(b, r)`` runs (a batch that spans
    two such stretches may take a run from each), as many places as a random permutation's
    batch draws from when the runs come from all over the dataset.

    Examples:
        >>> rng = np.random.default_rng(0)
        >>> labels = interleave_labels(np.array([3, 3, 3]), rng, "stratified")
        >>> [sorted(labels[i : i + 3].tolist()) for i in (0, 3, 6)]
        [[0, 1, 2], [0, 1, 2], [0, 1, 2]]
        >>> sorted(interleave_labels(np.array([2, 1]), rng, "uniform").tolist())
        [0, 0, 1]
    """
    labels = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    if kind == "uniform":
        return rng.permutation(labels)
    starts = np.zeros(len(lengths), dtype=np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    ordinals = np.arange(len(labels), dtype=np.float64) - np.repeat(starts, lengths)
    keys = (ordinals + rng.random(len(labels))) / np.repeat(lengths, lengths)
    return labels[np.argsort(keys, kind="stable")]


Refs = tuple[np.ndarray, np.ndarray]  # (shard numbers, sample ordinals within the shards)


def stream_samples(plan: PassPlan, rank: int, phase: int) -> Iterator[Refs]:
    """``(shards, ordinals)`` of one stream's samples, window by window, in reading order."""
    stream = StreamId(plan.epoch, plan.pass_index, rank, phase)
    lanes = StreamLanes(plan.shape, phase)
    index = 0
    while lanes.before(index) < lanes.total:
        window = build_window(plan.sequence, plan.shape, plan.options, stream, index)
        shards = np.fromiter((run.shard for run in window.runs), np.int64, len(window.runs))
        firsts = np.fromiter((run.first for run in window.runs), np.int64, len(window.runs))
        yield shards[window.labels], firsts[window.labels] + window.ordinals
        index += 1


def planned_batches(plan: PassPlan, rank: int) -> Iterator[Refs]:
    """``(shards, ordinals)`` of every batch plan rank ``rank`` yields in the pass, in order.

    Examples:
        >>> from shardstream.streaming._planning.order import PlanOptions, epoch_sequence
        >>> from shardstream.streaming._planning.split import Layout, Shape
        >>> options = PlanOptions(block_size=4, piece_size=2, num_open=4, chunk_size=2)
        >>> sequence = epoch_sequence(np.array([8, 8]), 0, 0, options)
        >>> plan = PassPlan(sequence, Shape.of(16, Layout(1, 2, 4), options), options, 0, 0)
        >>> sum(len(shards) for shards, _ in planned_batches(plan, 0))
        16
    """
    shape, batch = plan.shape, plan.shape.layout.batch_size
    streams = [stream_samples(plan, rank, phase) for phase in range(shape.layout.num_workers)]
    pending: list[list[Refs]] = [[] for _ in streams]
    for step in range(shape.steps):
        phase, micro = shape.step(step)
        wanted = min(batch, int(shape.stream_samples[phase]) - micro * batch)
        yield _take(streams[phase], pending[phase], wanted)


def _take(source: Iterator[Refs], pending: list[Refs], count: int) -> Refs:
    """The next ``count`` samples of a stream (``pending`` holds what was read but not taken)."""
    have = sum(len(shards) for shards, _ in pending)
    while have < count:
        shards, ordinals = next(source)
        pending.append((shards, ordinals))
        have += len(shards)
    shards = np.concatenate([part for part, _ in pending])
    ordinals = np.concatenate([part for _, part in pending])
    pending[:] = [(shards[count:], ordinals[count:])] if len(shards) > count else []
    return shards[:count], ordinals[:count]
