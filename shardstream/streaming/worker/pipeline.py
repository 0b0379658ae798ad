"""What one DataLoader worker runs for a pass: one timed loop over batches of raw samples.

:func:`run_batches` is the worker's one per-batch loop: it takes the next batch's raw samples
from a source, converts and collates them (:class:`Batcher`), counts them in the stage clock
and hands them out. Two sources feed it:

- a dataset with counts (a manifest): :func:`run_steps`. A worker serves every
  ``num_workers``-th step of the pass (see :mod:`shardstream.streaming.planning.schedule`); each
  step reads a slice of one stream per plan rank through a :class:`~.cursor.StreamCursor`. A
  resumed worker starts at its next step: nothing before it is read or replayed.
- shards without counts: whole shards, interleaved and shuffled (:mod:`.wholeshardpass`).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import itertools
import logging
import time
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from typing import Any

from shardstream.errors import DecodeError
from shardstream.storage.remote.retry import retries_in_process
from shardstream.streaming.planning.schedule import PassPlan, steps_of_worker
from shardstream.streaming.planning.windows import StreamId
from shardstream.streaming.worker.cursor import StreamCursor
from shardstream.streaming.worker.reader import ShardReader, WorkerStats
from shardstream.streaming.worker.stageclock import StageClock

__all__ = ["Batcher", "StepJob", "announce_first_step", "run_batches", "run_steps"]

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
        converted = [self._convert(sample, stats) for sample in samples]
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

    def _convert(self, sample: Any, stats: WorkerStats) -> Any:
        if sample is None:
            return None
        try:
            return self.convert(sample)
        except DecodeError as error:
            if self.on_error != "skip":
                raise
            stats.skipped += 1
            logger.warning("skipping sample: %s", error)
            return None


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
