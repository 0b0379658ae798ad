"""Per-process stage counters for loader statistics, in one shared-memory table.

Each reading process (a DataLoader worker, or the training process without workers) owns one
row and is its only writer; it adds what a :class:`StageClock` counted once per batch. See
:mod:`shardstream.streaming._diagnostics.stats` for what the training process makes of them.

What one DataLoader worker runs for a pass: one timed loop over batches of raw samples.

:func:`run_batches` is the worker's one per-batch loop: it takes the next batch's raw samples
from a source, converts and collates them (:class:`Batcher`), counts them in the stage clock
and hands them out. Two sources feed it:

- a dataset with counts (a manifest): :func:`run_steps`. A worker serves every
  ``num_workers``-th step of the pass (see :mod:`shardstream.streaming._planning.split`); each
  step reads a slice of one stream per plan rank through a :class:`~.cursor.StreamCursor`. A
  resumed worker starts at its next step: nothing before it is read or replayed.
- shards without counts: whole shards, interleaved and shuffled (this module).

What one DataLoader worker runs for shards of unknown length (no manifest): its whole
shards, several open at once, through a bounded shuffle buffer, in batches.

Each stage is a generator function: :func:`interleave_shards` -> :func:`shuffle_in_buffer` ->
:func:`in_batches`, fed to the worker's one timed loop (:func:`~.pipeline.run_batches`)."""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from shardstream._storage.backends.localmaps import lost_bytes
from shardstream._storage.remote.retry import retries_in_process
from shardstream.errors import DecodeError, ShardFormatError
from shardstream.streaming._planning.split import PassPlan, WholeShardPlan, steps_of_worker
from shardstream.streaming._planning.windows import StreamId
from shardstream.streaming._worker.cursor import StreamCursor
from shardstream.streaming._worker.reader import SKIP_ADVICE, ShardReader, WorkerStats

__all__ = [
    "Batcher",
    "Draws",
    "FIELDS",
    "STAGES",
    "StageClock",
    "StatsBoard",
    "StepJob",
    "announce_first_step",
    "in_batches",
    "interleave_shards",
    "run_batches",
    "run_steps",
    "run_whole_shards",
    "shuffle_in_buffer",
]


#: What each reading process counts, one column each.
FIELDS = ("read_s", "decode_s", "transform_s", "collate_s", "samples", "batches", "bytes",
          "skipped", "retries")  # fmt: skip
#: The stages a batch goes through in a worker, with the column of each.
STAGES = {"storage": "read_s", "decode": "decode_s", "transform": "transform_s",
          "collate": "collate_s"}  # fmt: skip


class StatsBoard:
    """One shared-memory row of counters per reading process: row 0 is the training process
    (``num_workers=0``), row ``w + 1`` DataLoader worker ``w``.

    Args:
        max_workers: The most DataLoader workers that will report (the dataset passes the
            most its channel supports).
    """

    def __init__(self, max_workers: int) -> None:
        import torch

        self._table = torch.zeros((max_workers + 1, len(FIELDS)), dtype=torch.float64)
        self._table.share_memory_()

    def row(self, worker: int | None) -> np.ndarray:
        """The row a process adds to (a numpy view of the shared table)."""
        return self._table.numpy()[0 if worker is None else worker + 1]

    def read(self) -> np.ndarray:
        """A copy of the whole table."""
        return self._table.numpy().copy()


class StageClock:
    """What one process counted since it last published: plain float attributes (one
    attribute add per sample, no array access), added to the shared row once per batch."""

    __slots__ = ("row", *FIELDS)
    read_s: float
    decode_s: float
    transform_s: float
    collate_s: float
    samples: float
    batches: float
    bytes: float
    skipped: float
    retries: float

    def __init__(self, row: np.ndarray) -> None:
        self.row = row
        self._zero()

    def _zero(self) -> None:
        self.read_s = self.decode_s = self.transform_s = self.collate_s = 0.0
        self.samples = self.batches = self.bytes = self.skipped = self.retries = 0.0

    def publish(self) -> None:
        """Add what was counted to the shared row (once per batch)."""
        self.row += [getattr(self, field) for field in FIELDS]
        self._zero()


logger = logging.getLogger("shardstream.streaming")


@dataclasses.dataclass(frozen=True)
class Batcher:
    """Turns the raw samples of one step into what the worker hands out.

    Attributes:
        convert: Decodes and transforms one raw sample.
        batch_size: Samples per batch, or None to hand out single samples.
        collate: Makes one batch of converted samples.
        on_error: ``"skip"`` drops samples that fail to decode (counted); ``"raise"`` raises.
    """

    convert: Callable[[Any], Any]
    batch_size: int | None
    collate: Callable[[Sequence[Any]], Any]
    on_error: str = "raise"
    clock: StageClock | None = None

    def finish(self, samples: Sequence[Any], stats: WorkerStats) -> list[Any]:
        """What to hand out for these samples: ``[batch]``, or the samples themselves.

        Skipped samples (``None``) leave a batch shorter rather than shifting later batches,
        so every rank keeps the same number of batches.
        """
        clock = self.clock
        skipped = stats.skipped
        stats.skipped += sum(sample is None for sample in samples)  # placeholders: unreadable
        # Before their bytes are touched: a sample whose memory-mapped shard file was cut since
        # it was read would kill the process with SIGBUS. One fstat per map for the step; only
        # when something was lost is each sample checked, to raise or skip exactly those.
        lost = lost_bytes(v for s in samples if isinstance(s, dict) for v in s.values())
        if lost is None and self.on_error != "skip":  # errors raise as they come: no guard
            convert = self.convert
            converted = [None if sample is None else convert(sample) for sample in samples]
        else:
            converted = [self._convert(sample, stats, lost is not None) for sample in samples]
        kept = [value for value in converted if value is not None]
        if clock is not None:
            clock.samples += len(kept)
            clock.skipped += stats.skipped - skipped
        if self.batch_size is None:
            return kept
        if kept:
            if clock is None:
                return [self.collate(kept)]
            start = time.perf_counter()
            batch = self.collate(kept)
            clock.collate_s += time.perf_counter() - start
            return [batch]
        raise DecodeError(
            f"all {len(samples)} samples of one batch failed to load (see the log); an empty "
            "batch cannot be collated. Check the shards with `shardstream verify`."
        )

    def _convert(self, sample: Any, stats: WorkerStats, check: bool) -> Any:
        if sample is None:
            return None
        lost = lost_bytes(sample.values()) if check and isinstance(sample, dict) else None
        if lost is not None:
            return self._skip_lost(lost, sample, stats)
        try:
            return self.convert(sample)
        except DecodeError as error:
            if self.on_error != "skip":
                raise
            stats.skipped += 1
            logger.warning("skipping sample: %s", error)
            return None

    def _skip_lost(self, lost: str, sample: dict[str, Any], stats: WorkerStats) -> None:
        """Raise ``lost`` (what a cut shard file lost), or skip the sample: counted, and logged
        once per shard and pass as the reader logs the shards it skips."""
        if self.on_error != "skip":
            raise ShardFormatError(lost)
        stats.skipped += 1
        shard = str(sample.get("__url__", ""))
        if shard not in stats.broken:
            stats.broken.add(shard)
            logger.warning(
                "skipping samples that cannot be read (on_error='skip'; the count follows at the "
                "end of the pass): %s", SKIP_ADVICE.sub("", lost),
            )  # fmt: skip


@dataclasses.dataclass(frozen=True)
class StepJob:
    """One worker's share of a pass.

    Attributes:
        plan: The pass.
        ranks: The plan ranks this process's rank reads.
        first: The first step of this worker's turn (the pass's start plus its turn).
        num_workers: DataLoader workers of the rank: this worker serves every such step.
    """

    plan: PassPlan
    ranks: range
    first: int
    num_workers: int


#: Passes not finished yet, closed at exit while every module is intact: a pass dropped
#: unfinished (a loop left with ``break``, its iterator in a global) would otherwise be closed
#: during interpreter shutdown, when its modules' names are already cleared to None.
_open_passes: weakref.WeakSet[Generator[Any, None, None]] = weakref.WeakSet()


@atexit.register
def _close_open_passes() -> None:
    for passing in list(_open_passes):
        with contextlib.suppress(ValueError):  # one running in another thread: it ends itself
            passing.close()


def run_batches(
    batches: Generator[list[Any], None, None],
    reader: ShardReader,
    batcher: Batcher,
    stats: WorkerStats,
) -> Iterator[Any]:
    """The worker's one per-batch loop: yield what ``batcher`` makes of each list of samples.

    Getting the next list from ``batches`` is the batch's reading time (with the bytes and
    retries it took). ``stats.batches`` counts the batches handed out, before each is handed
    out, so a resume state taken while the worker waits between them is exact. At the end (or
    when closed early, at the latest when the process exits) ``batches`` is closed, then
    ``reader``.
    """
    passing = _batch_loop(batches, reader, batcher, stats)
    _open_passes.add(passing)
    return passing


def _batch_loop(
    batches: Generator[list[Any], None, None],
    reader: ShardReader,
    batcher: Batcher,
    stats: WorkerStats,
) -> Generator[Any, None, None]:
    clock = batcher.clock
    retried = retries_in_process()  # retries of background reads count whenever they happen
    try:
        while True:
            started, before = time.perf_counter(), stats.bytes_read
            samples = next(batches, None)
            if samples is None:
                break
            if clock is not None:
                clock.read_s += time.perf_counter() - started
                clock.bytes += stats.bytes_read - before
                now = retries_in_process()
                clock.retries += now - retried
                retried = now
            out = batcher.finish(samples, stats)
            stats.batches += 1
            if clock is not None:
                clock.batches += 1
                clock.publish()
            yield from out
    finally:
        batches.close()
        reader.close()


def run_steps(
    job: StepJob, reader: ShardReader, batcher: Batcher, stats: WorkerStats
) -> Iterator[Any]:
    """Yield this worker's batches (or samples) of the pass, from ``job.first`` on."""
    return run_batches(_step_samples(job, reader, stats), reader, batcher, stats)


def announce_first_step(job: StepJob, reader: ShardReader) -> list[StreamCursor]:
    """Announce the pieces of ``job``'s first step (a pass to come) without reading them.

    Returns the cursors that announced them (each one's group of announcements): close them
    once the pass that reads them has announced its own, which takes over the same ranges.
    """
    if not reader.announces:
        return []
    plan = job.plan
    steps = steps_of_worker(plan.shape, job.first, 0, job.num_workers, job.ranks)
    cursors = []
    for _, reads in itertools.islice(steps, 1):
        for read in reads:
            stream = StreamId(plan.epoch, plan.pass_index, read.rank, read.phase)
            cursor = StreamCursor(plan, stream, reader, shared=True)  # its slice's pieces only
            cursor.announce(read.start, read.stop)
            cursors.append(cursor)
    return cursors


def _step_samples(
    job: StepJob, reader: ShardReader, stats: WorkerStats
) -> Generator[list[Any], None, None]:
    """The raw samples of each step this worker serves, in order (its cursors closed at the end)."""
    plan = job.plan
    cursors: dict[tuple[int, int], StreamCursor] = {}
    # A worker meets its own streams in its first steps; a stream met later is one whose
    # last steps it shares with other workers (see planning.schedule).
    own_steps = -(-plan.layout.num_workers // job.num_workers)
    steps = steps_of_worker(plan.shape, job.first, 0, job.num_workers, job.ranks)
    try:
        for served, (_, reads) in enumerate(steps):
            samples: list[Any] = []
            for read in reads:
                cursor = cursors.get((read.rank, read.phase))
                if cursor is None:
                    stream = StreamId(plan.epoch, plan.pass_index, read.rank, read.phase)
                    shared = served >= own_steps
                    cursor = StreamCursor(plan, stream, reader, shared)
                    cursors[(read.rank, read.phase)] = cursor
                samples.extend(cursor.read(read.start, read.stop))
            yield samples
    finally:
        for cursor in cursors.values():
            cursor.close()
    if stats.skipped:
        broken = sorted(stats.broken)
        where = f" (unreadable shards: {', '.join(broken[:3])}{', ...' if len(broken) > 3 else ''})"
        logger.warning(
            "a worker skipped %d sample(s) in this pass%s", stats.skipped, where if broken else ""
        )


_END = object()
#: Uniform floats drawn per numpy call (a call per draw would cost microseconds per sample).
_DRAWS_PER_CALL = 1024


def run_whole_shards(
    plan: WholeShardPlan,
    reader: ShardReader,
    batcher: Batcher,
    stats: WorkerStats,
    num_open: int,
    shuffle_buffer: int,
    shuffle: bool,
) -> Iterator[Any]:
    """Yield this worker's batches (or samples) of its whole shards, after ``skip_items``.

    A resume reads and drops the items already consumed: their shards' lengths are unknown,
    so there is no shortcut. The batches' reading time includes the interleave and the buffer.
    """

    def open_shard(number: int) -> Iterator[Any]:
        return reader.open(plan.shards[number], 0, None)

    samples = interleave_shards(open_shard, len(plan.shards), num_open, plan.seed, shuffle)
    samples = shuffle_in_buffer(samples, shuffle_buffer if shuffle else 1, plan.seed)
    size = batcher.batch_size or 1
    if plan.skip_items:  # read and dropped, not decoded
        samples = itertools.islice(samples, plan.skip_items * size, None)
    return run_batches(in_batches(samples, size), reader, batcher, stats)


def interleave_shards(
    open_shard: Callable[[int], Iterator[Any]],
    num_shards: int,
    num_open: int,
    seed: Sequence[int],
    shuffle: bool = True,
) -> Iterator[Any]:
    """Stage: every sample of shards ``0..num_shards-1``, each next one from a random open shard.

    A single stream through a shard written in class order yields one class for a long time,
    and a shuffle buffer mixes only what it holds; ``num_open`` shards open at once put up to
    ``num_open`` classes in flight, with memory bounded by ``num_open`` open streams. Shards are
    opened in a seeded order; a shard ends when its stream does.

    Args:
        open_shard: ``open_shard(number)`` yields the samples of shard ``number``.
        num_shards: Shards to read.
        num_open: Shards read at the same time (1 reads them one after another).
        seed: Seed sequence for the opening order and the draws, e.g. ``[seed, epoch, rank,
            worker]``.
        shuffle: Open shards in a seeded order and draw among them; with False, in order, one
            at a time.

    Examples:
        >>> sorted(interleave_shards(lambda n: iter([n, n]), 2, num_open=2, seed=[0]))
        [0, 0, 1, 1]
    """
    num_open = max(1, num_open) if shuffle else 1
    order = (
        np.random.default_rng([*seed, 1]).permutation(num_shards).tolist()
        if shuffle
        else list(range(num_shards))
    )
    below = Draws([*seed, 2]).below
    streams: list[Iterator[Any]] = []
    following = 0  # the next shard of ``order`` to open
    try:
        while True:
            while len(streams) < num_open and following < len(order):
                streams.append(open_shard(order[following]))
                following += 1
            if not streams:
                return
            pick = below(len(streams)) if len(streams) > 1 else 0
            sample = next(streams[pick], _END)
            if sample is _END:
                _close(streams.pop(pick))
                continue
            yield sample
    finally:
        for stream in streams:
            _close(stream)


def shuffle_in_buffer(samples: Iterable[Any], size: int, seed: Sequence[int]) -> Iterator[Any]:
    """Stage: ``samples`` shuffled through a buffer of ``size`` (0 or 1: in order).

    Memory is bounded by ``size`` samples (the encoded bytes, before decoding).

    Examples:
        >>> sorted(shuffle_in_buffer(range(4), size=2, seed=[0]))
        [0, 1, 2, 3]
    """
    buffer: list[Any] = []
    size, below = max(1, size), Draws([*seed, 3]).below
    for item in samples:
        if len(buffer) < size:
            buffer.append(item)
            continue
        pick = below(size)
        out, buffer[pick] = buffer[pick], item
        yield out
    while buffer:
        pick = below(len(buffer))
        buffer[pick], buffer[-1] = buffer[-1], buffer[pick]
        yield buffer.pop()


def in_batches(samples: Iterator[Any], size: int) -> Generator[list[Any], None, None]:
    """Stage: consecutive lists of ``size`` samples (the last one shorter) until ``samples``
    ends."""
    while batch := list(itertools.islice(samples, size)):
        yield batch


class Draws:
    """Seeded uniform draws in ``[0, n)``, cheap enough to make one per sample: one numpy call
    per block of floats, each turned into ``int(u * n)`` (a bias below 1e-9 for any ``n`` a
    shuffle uses).

    Examples:
        >>> draws = Draws([0, 1])
        >>> all(0 <= draws.below(10) < 10 for _ in range(5))
        True
    """

    def __init__(self, seed: Sequence[int]) -> None:
        self._rng = np.random.default_rng(list(seed))
        self._block: list[float] = []
        self._used = 0

    def below(self, n: int) -> int:
        """One draw in ``[0, n)``."""
        if self._used == len(self._block):
            self._block = self._rng.random(_DRAWS_PER_CALL).tolist()
            self._used = 0
        value = self._block[self._used]
        self._used += 1
        return int(value * n)


def _close(stream: Iterator[Any]) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        close()
