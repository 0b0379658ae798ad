"""One dataset's pass control in one process: ranks, the next pass, and the worker's state.

A :class:`~shardstream.streaming.StreamingDataset` holds one :class:`PassControl`; DataLoader
workers get a copy with the dataset (its channel is shared memory, so every copy sees the
same pinned epoch and directives). It reads rank and world size in the training process
(DataLoader workers do not see ``torch.distributed``) and hands them to the workers.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any

from shardstream.errors import ConfigError
from shardstream.streaming._control import versionset as agreement
from shardstream.streaming._control.context import Context, current_context, post_first
from shardstream.streaming._control.resumestate import (
    PassState,
    VersionNumber,
    WorkerPosition,
    decode_state,
    encode_state,
)
from shardstream.streaming._control.workerpass import PassInputs, WorkerJob, WorkerPass, start_pass
from shardstream.streaming._decoding.decode import SampleConverter
from shardstream.streaming._planning.split import Layout, PassPlan, samples_per_rank
from shardstream.streaming._worker.pipeline import StatsBoard

__all__ = ["PassControl"]

logger = logging.getLogger("shardstream.streaming")


class PassControl:
    """Which pass this process reads next, and its state for the ``Stateful`` protocol.

    Args:
        inputs: What pass control needs of the dataset.
    """

    def __init__(self, inputs: PassInputs) -> None:
        self.inputs = inputs
        self._settled = False  # whether the ranks agreed on the version (torch.distributed)
        self._agreed: str | None = None  # the dataset's key in the process group's store
        self._refreshes = 0  # refreshes so far, which number their keys
        self._ranks = self._read_ranks()
        #: A Stateful restore, for the next pass.
        self._pending: tuple[PassState, WorkerPosition] | None = None
        self._running: WorkerPass | None = None  # the pass under way in this process

    # -- epochs and ranks ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch pinned by :meth:`pin` (0 before any call)."""
        return self.inputs.channel.pinned

    def pin(self, epoch: int) -> None:
        """Read ``epoch`` in every process's next pass; read rank and world size again (and
        with ``follow_versions``, move to the newest version)."""
        self.inputs.channel.pin(epoch)
        self._ranks = self._read_ranks()
        if self.inputs.settings.options.follow_versions:
            self.refresh()

    def _read_ranks(self) -> tuple[int, int]:
        """Rank and world size; the first time torch.distributed gives them, the ranks settle
        on one version (see :func:`.agreement.settle`)."""
        options = self.inputs.settings.options
        context = current_context(options.rank, options.world_size)
        if not self._settled and options.rank is None and context.world_size > 1:
            self._agreed = agreement.settle(self.inputs.versions, post_first, context.rank)
            self.inputs.channel.set_version(self.inputs.opened.number)
            self._settled = True
        return context.rank, context.world_size

    # -- versions -----------------------------------------------------------------------------

    def refresh(self) -> VersionNumber:
        """Move fresh epochs to the newest published version, every rank to the same one
        (see :func:`.agreement.refresh`).

        Raises:
            ConfigError: The ranks were given explicitly (they cannot agree), the version was
                pinned, or this rank cannot read the version the job moves to.
        """
        options = self.inputs.settings.options
        if options.world_size is not None and options.world_size > 1:
            raise ConfigError(
                "ranks given with rank=/world_size= cannot move to a new version together "
                "(that takes torch.distributed); make new datasets with version=N on every rank"
            )
        self._refreshes += 1
        key = None if self._agreed is None else f"{self._agreed}/refresh/{self._refreshes}"
        number = agreement.refresh(self.inputs.versions, post_first, key, self._ranks[0])
        self.inputs.channel.set_version(number)
        return number

    def epoch_starts(self, after_pin: bool) -> None:
        """A loader starts a fresh epoch in the training process: with ``follow_versions``,
        move to the newest version (unless ``set_epoch`` did just now)."""
        if self.inputs.settings.options.follow_versions and not after_pin:
            self.refresh()

    def context(self) -> Context:
        """Rank, world size (as seen by the training process) and the current worker."""
        return current_context(*self._ranks)

    def layout(self, num_workers: int | None = None) -> Layout:
        """This rank's layout: world size, workers (default: the current ones), batch size."""
        return self.inputs.layout(self.context(), num_workers)

    # -- sizes --------------------------------------------------------------------------------

    def samples_per_rank(self, context: Context | None = None) -> int:
        """Samples each rank yields per epoch (requires counts)."""
        context = context or self.context()
        policy = self.inputs.settings.policy
        return samples_per_rank(self.inputs.epoch_samples(), context.world_size, policy)

    def epoch_steps(self) -> int:
        """Steps (batches, or samples) per rank in a fresh epoch at the current layout."""
        layout = self.inputs.settings.plan_layout(self.layout())
        return self.inputs.opened.plans.shape(self.inputs.epoch_samples(), layout).steps

    # -- passes and the Stateful protocol -----------------------------------------------------

    def next_job(self, convert: SampleConverter, board: StatsBoard | None) -> WorkerJob:
        """Start this process's next pass: what it reads, ready for :func:`.run.run_pass`."""
        context = self.context()
        pending, self._pending = self._pending, None
        running = start_pass(self.inputs, context, pending)
        self._running = running
        version = self.inputs.versions.get(running.state.dataset_version)
        return WorkerJob(
            running=running,
            context=context,
            shards=version.shards,
            settings=version.settings,
            tag_streams=version.mixture is not None,
            convert=convert,
            board=board,
            following=functools.partial(self._following, context, running),
        )

    def _following(self, context: Context, running: WorkerPass) -> PassPlan | None:
        """The pass this process reads after ``running`` if nothing changes meanwhile (the next
        epoch, fresh, at this layout), when the process outlives the pass (see
        :attr:`.channel.EpochChannel.ahead`); None otherwise, or without counts."""
        if not self.inputs.counted or not self.inputs.channel.ahead:
            return None
        state = PassState(running.state.epoch + 1, dataset_version=self.inputs.fresh_version)
        return self.inputs.plan(state, self.inputs.layout(context))

    def state_dict(self) -> dict[str, Any]:
        """This process's position: epoch, earlier passes, steps it served in this pass."""
        context = self.context()
        running = self._running
        if running is None:
            state = PassState(self.epoch)
            position = WorkerPosition(0, context.worker, 0, 0, context.worker)
        else:
            state, position = running.state, running.position(context.worker)
        layout = self.layout(context.num_workers)
        fingerprint = self.inputs.fingerprint(state.dataset_version)
        return encode_state(state, layout, fingerprint, position)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next pass continue from :meth:`state_dict`.

        Raises:
            ConfigError: Not a dataset's per-worker state, or as
                :meth:`.inputs.PassInputs.check_state`, for the same world size and worker
                count.
        """
        context = self.context()
        saved = decode_state(state)
        if saved.worker is None:
            raise ConfigError(
                "this is a StreamingDataLoader's state (it has no worker's place): restore it "
                "with the loader's load_state_dict, not the dataset's"
            )
        number = self.inputs.check_state(
            saved, self.layout(context.num_workers), elastic=False, allow_new_batch_size=False
        )
        restored = dataclasses.replace(saved.state, dataset_version=number)
        self._pending = (restored, saved.worker)
        # Should this pass be thrown away (a loader that finished its epoch starts afresh),
        # the next fresh pass of this worker still moves on to the following epoch.
        self.inputs.channel.restored(context.worker, context.num_workers, restored.epoch)
        if context.worker == 0:  # one line per rank
            self._log_restore(restored, saved.worker, context)

    def _log_restore(self, state: PassState, worker: WorkerPosition, context: Context) -> None:
        """Where a Stateful restore goes on: the epoch, and the batch the first worker serves
        next (each worker knows only its own turns; without workers, that is the rank's)."""
        step = worker.start + worker.role + worker.served * context.num_workers
        left = ""
        if self.inputs.counted:
            total = self.inputs.plan(state, self.layout(context.num_workers)).steps
            left = f" of {total} ({max(0, total - step)} batches left)"
        who = "the loader" if not context.in_worker else "its worker 0"
        logger.info(
            "rank %d of %d: dataset state restored in epoch %d; %s goes on at batch %d%s",
            context.rank, context.world_size, state.epoch, who, step, left,
        )  # fmt: skip
