"""A loader's place in the epoch: which pass it reads next, the steps it consumed, its state.

:class:`~shardstream.streaming.StreamingDataLoader` keeps one :class:`LoaderPosition` and
posts each pass to its workers through the dataset's channel. The state is the same on every
rank, so a checkpoint written by rank 0 alone restores every rank. A restore at a world size
that divides the pass's plan (with the same global batch) continues the pass; any other layout
starts a new pass with what the epoch has left (see
:mod:`shardstream.streaming._planning.leftover`).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from shardstream.errors import ConfigError, ResumeError
from shardstream.streaming._control.controller import PassControl
from shardstream.streaming._control.resumestate import (
    PassState,
    SavedState,
    decode_state,
    encode_state,
)
from shardstream.streaming._planning.leftover import PassRecord
from shardstream.streaming._planning.split import Layout

__all__ = ["LoaderPosition", "Position", "check_resumed"]

logger = logging.getLogger("shardstream.streaming")


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a rank's loader stands, in a trainer's terms.

    A finished epoch is written as the start of the next one (``epoch + 1``, batch 0): the
    place of the next batch, which a loop's ``range(position.epoch, num_epochs)`` starts from.

    Attributes:
        epoch: The epoch.
        epoch_batches: Batches of the epoch the rank consumed (in earlier passes too).
        global_batches: Batches the rank consumed in all epochs: what a trainer's step counts
            (its optimizer steps times the gradient accumulation).
        epoch_length: Batches of the epoch on this rank, or None when unknown (no manifest).

    Examples:
        >>> str(Position(1, 2, 9, 7))
        'epoch 1, batch 2 of 7 (9 batches in all)'
    """

    epoch: int
    epoch_batches: int
    global_batches: int
    epoch_length: int | None = None

    def __str__(self) -> str:
        length = "" if self.epoch_length is None else f" of {self.epoch_length}"
        return (
            f"epoch {self.epoch}, batch {self.epoch_batches}{length} "
            f"({self.global_batches} batches in all)"
        )


def check_resumed(
    position: Position,
    trainer: str,
    *,
    global_batches: int | None = None,
    epoch: int | None = None,
    epoch_batches: int | None = None,
) -> None:
    """Raise unless ``position`` is where the trainer is (the numbers given are compared).

    Raises:
        ResumeError: Names both positions and the likely causes.
    """
    same_total = global_batches is None or global_batches == position.global_batches
    here = (position.epoch, position.epoch_batches)
    same_place = epoch is None or (epoch, epoch_batches or 0) == here
    if same_total and same_place:
        return
    raise ResumeError(
        f"the loader is at {position}, but the trainer is at {trainer}: the loader's state was "
        "not restored, or was restored from another checkpoint than the model's. Save "
        "loader.state_dict() in every checkpoint and load_state_dict() it from the same one "
        "(Lightning and accelerate do this for a StreamingDataLoader they checkpoint)"
    )


class LoaderPosition:
    """The loader's pass: its state (None before the first), and whether it finished.

    Every method takes the loader's current ``num_workers`` (a DataLoader may change it).

    Args:
        control: The dataset's pass control.
    """

    def __init__(self, control: PassControl) -> None:
        self._control, self._inputs = control, control.inputs
        self._state: PassState | None = None  # None: take the dataset's epoch at the first pass
        self._finished = False
        self._pins_seen = self._inputs.channel.pin_count
        self._before_epoch = 0  # batches consumed in earlier epochs (a trainer's steps count them)
        #: Where the pass under way started (after a restore: the restored place), or None.
        self.pass_start: Position | None = None

    def _planned(self, state: PassState, num_workers: int) -> PassState:
        """``state`` with its pass's plan layout fixed (a fresh pass: from this layout)."""
        inputs = self._inputs
        if state.dataset_version is None:  # a fresh epoch reads the version the ranks settled
            state = dataclasses.replace(state, dataset_version=inputs.fresh_version)
        if state.plan is not None or not inputs.counted:
            return state
        physical = self._control.layout(num_workers)
        return dataclasses.replace(state, plan=inputs.settings.plan_layout(physical))

    def _pass_steps(self, num_workers: int) -> int | None:
        if not self._inputs.counted or self._state is None:
            return None
        return self._inputs.plan(self._state, self._control.layout(num_workers)).steps

    def epoch_steps(self, num_workers: int) -> int | None:
        """Steps consumed in earlier passes of the epoch plus this pass's; None before one."""
        return None if self._state is None else self._epoch_length(self._state, num_workers)

    def start_pass(self, num_workers: int) -> None:
        """Choose the next pass (a pinned epoch, the rest of this one, or the next one) and
        post it to the workers."""
        channel = self._inputs.channel
        pinned = channel.pin_count != self._pins_seen
        self._pins_seen = channel.pin_count
        total = self._pass_steps(num_workers)
        state = self._state
        done = self._finished or (
            total is not None and state is not None and state.consumed >= total
        )
        if state is None or (pinned and (self._control.epoch != state.epoch or done)):
            state = PassState(self._control.epoch)
        elif done:
            state = PassState(state.epoch + 1)
        if state is not self._state:  # a fresh epoch (follow_versions moves to the newest)
            self._control.epoch_starts(after_pin=pinned)
            if self._state is not None:  # the trainer's steps count the last epoch's batches
                self._before_epoch += _epoch_batches(self._state)
        self._state = self._planned(state, num_workers)
        self._pass_steps(num_workers)  # the plan made here, before workers fork: they share it
        self._finished = False
        self.pass_start = self.position(num_workers)
        channel.post(self._state)

    def advance(self) -> None:
        """One more step of the pass was consumed."""
        if self._state is not None:
            self._state = dataclasses.replace(self._state, consumed=self._state.consumed + 1)

    def finish(self) -> None:
        """The pass ran to its end (the next one reads the next epoch)."""
        self._finished = True

    def position(self, num_workers: int) -> Position:
        """Epoch, batches consumed in it and in all (see :class:`Position`); a finished epoch
        is the start of the next, which the next pass reads."""
        state = self._state or self._planned(PassState(self._control.epoch), num_workers)
        consumed = _epoch_batches(state)
        length = self._epoch_length(state, num_workers)
        total = self._before_epoch + consumed
        if self._finished or (length is not None and consumed >= length):
            state = self._planned(PassState(state.epoch + 1), num_workers)
            return Position(state.epoch, 0, total, self._epoch_length(state, num_workers))
        return Position(state.epoch, consumed, total, length)

    def _epoch_length(self, state: PassState, num_workers: int) -> int | None:
        """Batches of ``state``'s epoch on this rank (earlier passes' and this one's)."""
        if not self._inputs.counted:
            return None
        steps = self._inputs.plan(state, self._control.layout(num_workers)).steps
        return sum(record.consumed_steps for record in state.history) + steps

    def state_dict(self, num_workers: int) -> dict[str, Any]:
        """The loader's state (a finished epoch saves as fully consumed)."""
        state = self._state or self._planned(PassState(self._control.epoch), num_workers)
        total = self._pass_steps(num_workers)
        if self._finished and total is not None:
            state = dataclasses.replace(state, consumed=total)
        layout = self._control.layout(num_workers)
        fingerprint = self._inputs.fingerprint(state.dataset_version)
        global_batches = self._before_epoch + _epoch_batches(state)
        return encode_state(state, layout, fingerprint, global_batches=global_batches)

    def load_state_dict(
        self, state: dict[str, Any], num_workers: int, allow_new_batch_size: bool
    ) -> None:
        """Continue from :meth:`state_dict` at this layout (see the module docstring).

        Raises:
            ConfigError: As :meth:`.inputs.PassInputs.check_state`, or a dataset without
                counts is resumed at another layout.
        """
        current = self._control.layout(num_workers)
        saved = decode_state(state)
        number = self._inputs.check_state(
            saved, current, elastic=True, allow_new_batch_size=allow_new_batch_size
        )
        restored = dataclasses.replace(saved.state, dataset_version=number)
        if not self._inputs.counted:
            if saved.layout != current or restored.history:
                raise ConfigError(
                    "cannot continue this epoch with another world size, worker count or batch "
                    "size: the source has no manifest, so the samples already read cannot be "
                    "known (run `shardstream index` on the shards to allow it)"
                )
        elif restored.plan is None or not _continues(restored.plan, current):
            record = PassRecord(restored.plan or saved.layout, restored.consumed)
            restored = dataclasses.replace(
                restored, history=(*restored.history, record), plan=None, consumed=0
            )
        self._state = self._planned(restored, num_workers)
        self._finished = False
        self._pins_seen = self._inputs.channel.pin_count
        self._before_epoch = self._batches_before(saved, restored, num_workers)
        self.pass_start = None
        self._log_restore(num_workers)

    def _batches_before(self, saved: SavedState, state: PassState, num_workers: int) -> int:
        """Batches of earlier epochs: as saved, or (states saved before that was recorded)
        the epoch's number times the batches of a fresh epoch at the state's plan layout."""
        if saved.global_batches is not None:
            return saved.global_batches - _epoch_batches(state)
        if not self._inputs.counted:
            return 0
        layout = state.plan or self._control.layout(num_workers)
        fresh = self._inputs.opened.plans.shape(self._inputs.epoch_samples(), layout).steps
        return state.epoch * fresh

    def _log_restore(self, num_workers: int) -> None:
        """One line per rank: where the restored loader goes on, and what the epoch has left."""
        position = self.position(num_workers)
        context = self._control.context()
        left = (
            ""
            if position.epoch_length is None
            else (f", {position.epoch_length - position.epoch_batches} batches left")
        )
        logger.info(
            "rank %d of %d: loader restored at %s%s", context.rank, context.world_size,
            position, left,
        )  # fmt: skip


def _epoch_batches(state: PassState) -> int:
    """Batches of ``state``'s epoch consumed: in its earlier passes and in the current one."""
    return sum(record.consumed_steps for record in state.history) + state.consumed


def _continues(plan: Layout, physical: Layout) -> bool:
    """Whether ``physical`` can go on reading a pass planned for ``plan`` (same global batch)."""
    return (
        plan.world_size % physical.world_size == 0
        and plan.world_size * plan.batch_size == physical.world_size * physical.batch_size
    )
