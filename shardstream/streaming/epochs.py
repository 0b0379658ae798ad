"""Which pass a process reads next: a fresh epoch, a loader's directive, or a Stateful restore.

Each pass of a worker (or of the training process without workers) starts here. The epoch
comes from the shared :class:`~.worker.channel.EpochChannel` (passes move on by themselves;
``set_epoch`` pins one), a :class:`~.loader.StreamingDataLoader` may post a directive (the rest
of a restored epoch), and torchdata's ``StatefulDataLoader`` may restore a worker's own state.
:class:`PassCache` keeps what a pass's plan costs to compute (the epoch's shard order, what an
epoch has left after restarts) for the next pass of the same epoch.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import zlib
from typing import TYPE_CHECKING, Any

from shardstream.catalog.shardlist import ShardList
from shardstream.streaming.context import Context
from shardstream.streaming.mixture import Mixture
from shardstream.streaming.planning.chunks import epoch_sequence
from shardstream.streaming.planning.passes import PassRecord, pass_sequence
from shardstream.streaming.planning.schedule import PassPlan
from shardstream.streaming.planning.sequence import BaseSequence, PassSequence
from shardstream.streaming.planning.split import Layout, PlanOptions, Shape
from shardstream.streaming.planning.wholeshardplan import role_after
from shardstream.streaming.resumestate import PassState
from shardstream.streaming.worker.reader import WorkerStats

if TYPE_CHECKING:
    from shardstream.streaming.dataset import StreamingDataset

__all__ = ["PassCache", "WorkerPass", "start_pass"]

logger = logging.getLogger("shardstream.streaming")

_RESTORE_WAIT_S = 60.0


class PassCache:
    """The latest epoch's sequence and passes, computed once per process and epoch.

    Args:
        shards: The dataset's shards (their counts).
        mixture: The mixture, if the dataset is one.
        options: The plan options.
    """

    def __init__(self, shards: ShardList, mixture: Mixture | None, options: PlanOptions) -> None:
        self._shards, self._mixture, self._options = shards, mixture, options
        self._length: int | None = None
        self._base: tuple[int, BaseSequence] | None = None
        self._passes: dict[tuple[int, tuple[PassRecord, ...]], PassSequence] = {}

    def epoch_length(self) -> int:
        """Samples in a fresh epoch of a single dataset."""
        if self._length is None:
            self._length = int(self._shards.counts().sum())
        return self._length

    def base(self, epoch: int) -> BaseSequence:
        """A fresh ``epoch``'s sequence: the epoch's chunks or shards in order, or the mixture's."""
        if self._base is None or self._base[0] != epoch:
            sequence: BaseSequence
            if self._mixture is not None:
                sequence = self._mixture.epoch_sequence(epoch, self._options)
            else:
                options = self._options
                sequence = epoch_sequence(self._shards.counts(), options.seed, epoch, options)
            self._base = (epoch, sequence)
        return self._base[1]

    def sequence(self, epoch: int, history: tuple[PassRecord, ...]) -> PassSequence:
        """The sequence of the pass after ``history`` (kept: restores ask for it repeatedly)."""
        key = (epoch, history)
        if key not in self._passes:
            base = self.base(epoch)
            self._passes = {key: pass_sequence(base, epoch, list(history), self._options)}
        return self._passes[key]

    def shape(self, length: int, layout: Layout) -> Shape:
        """The integer layout of a pass over ``length`` samples."""
        return Shape.of(length, layout, self._options)

    def plan(self, epoch: int, history: tuple[PassRecord, ...], layout: Layout) -> PassPlan:
        """The pass after ``history`` in ``epoch``, planned for ``layout``."""
        sequence = self.sequence(epoch, history)
        shape = self.shape(sequence.length, layout)
        return PassPlan(sequence, shape, self._options, epoch, len(history))


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


def start_pass(
    dataset: StreamingDataset, context: Context, pending: dict[str, Any] | None
) -> WorkerPass:
    """The pass this process reads next (see the module docstring)."""
    if pending is not None:
        running = _restored(dataset, context, pending)
    else:
        epoch, directive = dataset.channel.take(context.worker, context.num_workers)
        state = PassState.from_dict(directive) if directive else PassState(epoch)
        token = _pass_token(epoch, directive, dataset.channel.pin_count, context.num_workers)
        running = _fresh(dataset, context, state, token)
    return running


def _fresh(dataset: StreamingDataset, context: Context, state: PassState, token: int) -> WorkerPass:
    """A pass from its start step ``state.consumed``: this worker serves its turns from there."""
    if not dataset.counted:
        if len(dataset.shards) < context.world_size * context.num_workers:
            logger.warning(
                "%d shards for %d ranks x %d workers and no manifest: some workers get no "
                "data and ranks may see different sample counts",
                len(dataset.shards), context.world_size, context.num_workers,
            )  # fmt: skip
        role, served = role_after(context.worker, context.num_workers, state.consumed)
        return WorkerPass(state, None, 0, role, token, WorkerStats(batches=served))
    plan = dataset.plan(state, dataset.layout(context.num_workers))
    version = dataset.version if state.dataset_version is None else state.dataset_version
    state = dataclasses.replace(state, plan=plan.layout, dataset_version=version)
    return WorkerPass(state, plan, state.consumed, context.worker, token, WorkerStats())


def _restored(dataset: StreamingDataset, context: Context, saved: dict[str, Any]) -> WorkerPass:
    """The pass a Stateful restore continues; the next epoch if the rank had finished.

    A loader may save after the last batch without having seen the end of the epoch. The
    restored pass would then be empty; instead, when every worker of the rank had finished
    (they tell each other through the channel as they restore), it reads the next epoch.
    """
    state = PassState.from_dict(saved)
    start, role, token = int(saved["start"]), int(saved["role"]), int(saved["token"])
    stats = WorkerStats(batches=int(saved["served"]))
    plan = dataset.plan(state, dataset.layout(context.num_workers)) if dataset.counted else None
    workers = context.num_workers
    if plan is not None and _rank_done(dataset, context, plan, start, role, stats, token):
        # The loader goes on asking workers in turn after the one that gave the last batch:
        # the worker it asks first plays the first turn of the next epoch.
        first = (context.worker - role) % workers
        last = ((plan.steps - 1 - start) % workers + first) % workers
        state = PassState(state.epoch + 1)
        token = _pass_token(state.epoch, None, dataset.channel.pin_count, workers)
        running = _fresh(dataset, context, state, token)
        running.role = (context.worker - last - 1) % workers
    else:
        running = WorkerPass(state, plan, start, role, token, stats)
        if plan is not None:
            running.state = dataclasses.replace(state, plan=plan.layout)
    dataset.channel.restored(context.worker, workers, running.state.epoch)
    return running


def _rank_done(
    dataset: StreamingDataset,
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
    dataset.channel.report(context.worker, workers, token, done)
    if not done:
        return False
    reports = dataset.channel.wait_reports(workers, token, _RESTORE_WAIT_S)
    return reports is not None and all(reports)


def _pass_token(
    epoch: int, directive: dict[str, Any] | None, pin_count: int, num_workers: int
) -> int:
    """An id of a pass that all workers of a rank agree on (to recognise a restore together)."""
    text = json.dumps([epoch, directive, pin_count, num_workers], sort_keys=True)
    return zlib.crc32(text.encode("utf-8")) + 1
