"""What one process runs for a pass: its reader, batcher and clock, then the worker loop.

:class:`WorkerJob` is everything a pass needs, made by
:meth:`~.controller.PassControl.next_job`; :func:`run_pass` wires it to the worker loops
(:func:`~shardstream.streaming.worker.pipeline.run_steps` with counts,
:func:`~shardstream.streaming.worker.wholeshardpass.run_whole_shards` without).
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import logging
from collections.abc import Callable, Iterator
from typing import Any

from shardstream.catalog.shardlist import ShardList
from shardstream.storage.processlocal import ProcessLocal
from shardstream.streaming.control.context import Context
from shardstream.streaming.control.workerpass import WorkerPass
from shardstream.streaming.decoding.decode import SampleConverter
from shardstream.streaming.planning.schedule import PassPlan, plan_ranks
from shardstream.streaming.planning.wholeshardplan import plan_whole_shards
from shardstream.streaming.settings import Settings
from shardstream.streaming.worker import batch as batching
from shardstream.streaming.worker.pipeline import Batcher, StepJob, announce_first_step, run_steps
from shardstream.streaming.worker.reader import ShardReader
from shardstream.streaming.worker.stageclock import StageClock, StatsBoard
from shardstream.streaming.worker.wholeshardpass import run_whole_shards

__all__ = ["WorkerJob", "run_pass"]

logger = logging.getLogger("shardstream.streaming")


@dataclasses.dataclass(frozen=True)
class WorkerJob:
    """One process's pass and what it reads it with.

    Attributes:
        running: The pass (its plan, start, turn and counters).
        context: Where this process sits (read once per pass).
        shards: The shards of the version the pass reads.
        settings: The dataset's settings.
        tag_streams: Tag samples with their stream (a mixture).
        convert: Decodes and transforms one sample (the dataset's; copied per pass).
        board: The statistics table, or None when statistics are off.
        following: The pass this process reads next if nothing changes meanwhile, or None
            (it does not outlive this one); its first pieces are announced as this one ends.
    """

    running: WorkerPass
    context: Context
    shards: ShardList
    settings: Settings
    tag_streams: bool
    convert: SampleConverter
    board: StatsBoard | None
    following: Callable[[], PassPlan | None] = lambda: None


def run_pass(job: WorkerJob) -> Iterator[Any]:
    """The batches (or samples) this process yields in ``job``'s pass."""
    running, context, settings = job.running, job.context, job.settings
    if context.in_worker:
        _frozen.get()  # once per worker process
    stats = running.stats
    reader = ShardReader(job.shards, settings.read(job.tag_streams), stats)
    batcher = _batcher(job)
    if running.plan is None:  # no manifest: whole shards
        whole = plan_whole_shards(
            len(job.shards), settings.seed, settings.shuffle, running.state.epoch,
            rank=context.rank, world_size=context.world_size, role=running.role,
            num_workers=context.num_workers, skip=stats.batches,  # what the role yielded
        )  # fmt: skip
        return run_whole_shards(
            whole, reader, batcher, stats, settings.open_shards,
            settings.options.shuffle_buffer, settings.shuffle,
        )  # fmt: skip
    ranks = plan_ranks(running.plan.layout.world_size, context.world_size, context.rank)
    first = running.start + running.role + stats.batches * context.num_workers
    job_steps = StepJob(running.plan, ranks, first, context.num_workers)
    return _then_next(run_steps(job_steps, reader, batcher, stats), job)


def _then_next(items: Iterator[Any], job: WorkerJob) -> Iterator[Any]:
    """``items``; once the pass has announced its first pieces (its first item), the previous
    pass's announcements of them are dropped, and when it ends whole, the next pass's first
    pieces are announced (an object store fetches them while the training loop finishes the
    epoch, so the next one does not start with a request's latency)."""
    started = False
    for item in items:
        yield item
        if not started:
            started = True
            _drop_next(job.context.worker)
    _drop_next(job.context.worker)
    reader = ShardReader(job.shards, job.settings.read(job.tag_streams))
    try:
        plan = job.following() if reader.announces else None  # local shards: nothing to fetch
        if plan is not None:
            context = job.context
            ranks = plan_ranks(plan.layout.world_size, context.world_size, context.rank)
            steps = StepJob(plan, ranks, context.worker, context.num_workers)  # fresh: own turn
            announced = _announced.get().setdefault(context.worker, [])
            announced.append((reader, announce_first_step(steps, reader)))
            return
    except Exception as error:  # the next pass meets the problem itself, and reports it
        logger.debug("announcing the next pass failed: %s", error)
    reader.close()


def _drop_next(worker: int) -> None:
    """Drop what an earlier pass of ``worker`` announced of this one and this one did not take
    over (a thread loader's other workers, threads of this process, keep theirs)."""
    announced = _announced.get().get(worker, [])
    while announced:
        reader, cursors = announced.pop()
        for cursor in cursors:
            cursor.close()
        reader.close()


#: The next pass's announcements made as the last pass ended: (reader, cursors), this
#: process's, by the worker that made them (threads of a thread loader are several workers).
_announced: ProcessLocal[dict[int, list[tuple[ShardReader, list[Any]]]]] = ProcessLocal(dict)


def _freeze_inherited_objects() -> bool:
    """Put what a DataLoader worker holds when it starts reading out of the cyclic GC's reach.

    A worker forked from a training process inherits its heap (torch, the model's modules,
    botocore's models: millions of objects), and the first full collection in the worker walks
    all of them and writes their GC headers: every page of the parent's heap is then copied
    into the worker (copy-on-write), with the GIL held. Measured here, that stalled a worker's
    first batch from an object store by 0.2-0.3 s, and it costs memory in every worker.
    ``gc.freeze()`` moves those objects to the permanent generation, which collections skip
    (the ``gc`` documentation advises it around ``fork()``; here the worker applies it to
    itself, the training process is left alone); objects made afterwards are collected as
    usual. A spawned worker skips its imports' objects alike.
    """
    gc.freeze()
    return True


#: Made (frozen) once per worker process, at its first pass.
_frozen: ProcessLocal[bool] = ProcessLocal(_freeze_inherited_objects)


def _batcher(job: WorkerJob) -> Batcher:
    """The pass's batcher: the converter and collate with this process's clock and memory."""
    options = job.settings.options
    collate = functools.partial(
        batching.collate_pairs if options.output == "pair" else batching.collate_dicts,
        buffers=options.batch_buffers,
        shared=job.context.in_worker,  # read once per pass, not per batch
    )
    clock = None
    if job.board is not None:
        own_row = job.context.in_worker or job.context.in_thread  # one writer per row
        clock = StageClock(job.board.row(job.context.worker if own_row else None))
    convert = copy.copy(job.convert)  # the clock is this pass's; the dataset's stays unset
    convert.clock = clock
    return Batcher(convert, job.settings.batch_size, collate, job.settings.on_error, clock)
