"""What pass control needs of a dataset, as one small object (pass control never imports it).

A :class:`~shardstream.streaming.StreamingDataset` makes one :class:`PassInputs` from its
opened versions and the channel to its workers; the pass, the dataset's per-worker state and
the loader's position are all computed from it and a
:class:`~shardstream.streaming._control.context.Context`.

Which pass a process reads next: a fresh epoch, a loader's directive, or a Stateful restore.

Each pass of a worker (or of the training process without workers) starts here. The epoch
comes from the shared :class:`~.channel.EpochChannel` (passes move on by themselves;
``set_epoch`` pins one), a :class:`~shardstream.streaming.StreamingDataLoader` may post a
directive (the rest of a restored epoch), and torchdata's ``StatefulDataLoader`` may restore a
worker's own state. What a pass needs of the dataset comes in a :class:`~.inputs.PassInputs`.

What one process runs for a pass: its reader, batcher and clock, then the worker loop.

:class:`WorkerJob` is everything a pass needs, made by
:meth:`~.controller.PassControl.next_job`; :func:`run_pass` wires it to the worker loops
(:func:`~shardstream.streaming._worker.pipeline.run_steps` with counts,
:func:`~shardstream.streaming._worker.pipeline.run_whole_shards` without)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
import json
import logging
import zlib
from collections.abc import Callable, Iterator
from typing import Any

from shardstream._catalog.shardlist import ShardList
from shardstream._storage.background import ProcessLocal
from shardstream.streaming._control.context import Context, EpochChannel
from shardstream.streaming._control.resumestate import (
    PassState,
    SavedState,
    VersionNumber,
    WorkerPosition,
    check_fingerprint,
    check_layout,
    encode_pass,
)
from shardstream.streaming._control.versionset import DatasetVersion, VersionSet
from shardstream.streaming._decoding.decode import SampleConverter
from shardstream.streaming._options import Settings
from shardstream.streaming._planning.split import (
    Layout,
    PassPlan,
    plan_ranks,
    plan_whole_shards,
    role_after,
)
from shardstream.streaming._worker import batch as batching
from shardstream.streaming._worker.pipeline import (
    Batcher,
    StageClock,
    StatsBoard,
    StepJob,
    announce_first_step,
    run_steps,
    run_whole_shards,
)
from shardstream.streaming._worker.reader import ShardReader, WorkerStats

__all__ = [
    "PassInputs",
    "WorkerJob",
    "WorkerPass",
    "run_pass",
    "start_pass",
]


@dataclasses.dataclass(frozen=True)
class PassInputs:
    """A dataset's versions (with their settings and plans) and its channel to the workers.

    Attributes:
        versions: The opened version and older ones a resumed pass reads.
        channel: The epoch channel shared with the DataLoader workers.
    """

    versions: VersionSet
    channel: EpochChannel

    @property
    def opened(self) -> DatasetVersion:
        """The version the dataset opened (fresh epochs read it)."""
        return self.versions.opened

    @property
    def fresh_version(self) -> VersionNumber:
        """The version a fresh epoch reads: the one the training process settled on."""
        version = self.channel.version
        return self.opened.number if version is None else version

    @property
    def settings(self) -> Settings:
        """The dataset's settings, with the opened version's facts."""
        return self.opened.settings

    @property
    def counted(self) -> bool:
        """Whether sample counts are known (a manifest, or a mixture of datasets with them)."""
        return self.opened.shards.counted

    def layout(self, context: Context, num_workers: int | None = None) -> Layout:
        """The rank's physical layout (``num_workers``: default the context's)."""
        workers = context.num_workers if num_workers is None else max(1, num_workers)
        return Layout(context.world_size, workers, self.settings.micro_batch)

    def plan(self, state: PassState, physical: Layout) -> PassPlan:
        """The pass ``state`` describes (its plan layout, or a fresh one for ``physical``)."""
        layout = state.plan or self.settings.plan_layout(physical)
        plans = self.versions.get(state.dataset_version).plans
        return plans.plan(state.epoch, state.history, layout)

    def epoch_samples(self) -> int:
        """Samples in a fresh epoch over all ranks.

        Raises:
            TypeError: The counts are unknown (no ``len()``).
        """
        if not self.counted:
            raise TypeError(
                "this StreamingDataset has no manifest (it reads a shard pattern or URL list), "
                "so its length is unknown; run `shardstream index` on the shards (or build them "
                "with shardstream) for len(), equal per-rank counts and exact epochs"
            )
        opened = self.opened
        return opened.mixture.epoch_size if opened.mixture else opened.plans.epoch_length()

    def fingerprint(self, version: VersionNumber = None) -> dict[str, Any]:
        """The settings and dataset facts that fix which samples an epoch holds, in order.

        ``version``: of that version of the dataset (None: the opened one).
        """
        opened = self.versions.get(version)
        options = self.settings.options
        return {
            **opened.settings.fingerprint(),
            "num_shards": len(opened.shards),
            "num_samples": opened.manifest.num_samples if opened.manifest else None,
            "mixture": opened.mixture.fingerprint() if opened.mixture else None,
            "canonical": [options.canonical_ranks, options.canonical_workers],
        }

    def check_state(
        self, saved: SavedState, current: Layout, *, elastic: bool, allow_new_batch_size: bool
    ) -> VersionNumber:
        """Refuse a saved state this dataset cannot continue; the version its pass reads.

        Raises:
            ConfigError: An order-fixing setting or the layout changed in a way the caller
                cannot follow (names the field).
        """
        number = self.versions.number_for(saved)
        check_fingerprint(saved.fingerprint, self.fingerprint(number))
        check_layout(
            saved.layout, current, elastic=elastic, allow_new_batch_size=allow_new_batch_size
        )
        return number


logger = logging.getLogger("shardstream.streaming")

_RESTORE_WAIT_S = 60.0


@dataclasses.dataclass
class WorkerPass:
    """The pass a process is reading.

    Attributes:
        state: Epoch, earlier passes and plan layout (``consumed``: where the loader started).
        plan: The pass, or None without counts.
        start: The step this loader's pass started at (its first batch is that step).
        role: Which turn of the loader's workers this process plays.
        token: An id of the pass that all workers of a rank agree on.
        stats: Its counters; ``batches`` counts the steps this process has served.
    """

    state: PassState
    plan: PassPlan | None
    start: int
    role: int
    token: int
    stats: WorkerStats

    def position(self, worker: int) -> WorkerPosition:
        """What a per-worker state records of this pass (saved by ``worker``)."""
        return WorkerPosition(self.start, self.role, self.stats.batches, self.token, worker)


def start_pass(
    inputs: PassInputs, context: Context, pending: tuple[PassState, WorkerPosition] | None
) -> WorkerPass:
    """The pass this process reads next (see the module docstring).

    Args:
        inputs: What the pass needs of the dataset.
        context: Where this process sits.
        pending: A restored per-worker state (``Stateful``): its pass and the worker's place.
    """
    if pending is not None:
        return _restored(inputs, context, *pending)
    channel = inputs.channel
    epoch, directive = channel.take(context.worker, context.num_workers)
    state = directive or PassState(epoch)
    posted = encode_pass(directive) if directive else None
    token = _pass_token(epoch, posted, channel.pin_count, context.num_workers)
    return _fresh(inputs, context, state, token)


def _fresh(inputs: PassInputs, context: Context, state: PassState, token: int) -> WorkerPass:
    """A pass from its start step ``state.consumed``: this worker serves its turns from there."""
    if not inputs.counted:
        num_shards = len(inputs.opened.shards)
        if num_shards < context.world_size * context.num_workers:
            logger.warning(
                "%d shards for %d ranks x %d workers and no manifest: some workers get no "
                "data and ranks may see different sample counts",
                num_shards, context.world_size, context.num_workers,
            )  # fmt: skip
        role, served = role_after(context.worker, context.num_workers, state.consumed)
        return WorkerPass(state, None, 0, role, token, WorkerStats(batches=served))
    if state.dataset_version is None:  # a fresh epoch: the version the training process chose
        state = dataclasses.replace(state, dataset_version=inputs.fresh_version)
    plan = inputs.plan(state, inputs.layout(context))
    state = dataclasses.replace(state, plan=plan.layout)
    return WorkerPass(state, plan, state.consumed, context.worker, token, WorkerStats())


def _restored(
    inputs: PassInputs, context: Context, state: PassState, saved: WorkerPosition
) -> WorkerPass:
    """The pass a Stateful restore continues; the next epoch if the rank had finished.

    A loader may save after the last batch without having seen the end of the epoch. The
    restored pass would then be empty; instead, when every worker of the rank had finished
    (they tell each other through the channel as they restore), it reads the next epoch.
    """
    start, role, token = saved.start, saved.role, saved.token
    stats = WorkerStats(batches=saved.served)
    plan = inputs.plan(state, inputs.layout(context)) if inputs.counted else None
    workers = context.num_workers
    if plan is not None and _rank_done(inputs, context, plan, start, role, stats, token):
        # The loader goes on asking workers in turn after the one that gave the last batch:
        # the worker it asks first plays the first turn of the next epoch.
        first = (context.worker - role) % workers
        last = ((plan.steps - 1 - start) % workers + first) % workers
        state = PassState(state.epoch + 1)
        token = _pass_token(state.epoch, None, inputs.channel.pin_count, workers)
        running = _fresh(inputs, context, state, token)
        running.role = (context.worker - last - 1) % workers
    else:
        running = WorkerPass(state, plan, start, role, token, stats)
        if plan is not None:
            running.state = dataclasses.replace(state, plan=plan.layout)
    inputs.channel.restored(context.worker, workers, running.state.epoch)
    return running


def _rank_done(
    inputs: PassInputs,
    context: Context,
    plan: PassPlan,
    start: int,
    role: int,
    stats: WorkerStats,
    token: int,
) -> bool:
    """Whether every worker of the rank had served all its steps of the restored pass."""
    workers = context.num_workers
    done = stats.batches >= max(0, -(-(plan.steps - start - role) // workers))
    if workers == 1:
        return done
    inputs.channel.report(context.worker, workers, token, done)
    if not done:
        return False
    reports = inputs.channel.wait_reports(workers, token, _RESTORE_WAIT_S)
    return reports is not None and all(reports)


def _pass_token(
    epoch: int, directive: dict[str, Any] | None, pin_count: int, num_workers: int
) -> int:
    """An id of a pass that all workers of a rank agree on (to recognise a restore together)."""
    text = json.dumps([epoch, directive, pin_count, num_workers], sort_keys=True)
    return zlib.crc32(text.encode("utf-8")) + 1


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
