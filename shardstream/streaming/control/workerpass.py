"""Which pass a process reads next: a fresh epoch, a loader's directive, or a Stateful restore.

Each pass of a worker (or of the training process without workers) starts here. The epoch
comes from the shared :class:`~.channel.EpochChannel` (passes move on by themselves;
``set_epoch`` pins one), a :class:`~shardstream.streaming.StreamingDataLoader` may post a
directive (the rest of a restored epoch), and torchdata's ``StatefulDataLoader`` may restore a
worker's own state. What a pass needs of the dataset comes in a :class:`~.inputs.PassInputs`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import zlib
from typing import Any

from shardstream.streaming.control.context import Context
from shardstream.streaming.control.inputs import PassInputs
from shardstream.streaming.control.resumestate import PassState, WorkerPosition, encode_pass
from shardstream.streaming.planning.schedule import PassPlan
from shardstream.streaming.planning.wholeshardplan import role_after
from shardstream.streaming.worker.reader import WorkerStats

__all__ = ["WorkerPass", "start_pass"]

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
