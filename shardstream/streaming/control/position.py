"""A loader's place in the epoch: which pass it reads next, the steps it consumed, its state.

:class:`~shardstream.streaming.StreamingDataLoader` keeps one :class:`LoaderPosition` and
posts each pass to its workers through the dataset's channel. The state is the same on every
rank, so a checkpoint written by rank 0 alone restores every rank. A restore at a world size
that divides the pass's plan (with the same global batch) continues the pass; any other layout
starts a new pass with what the epoch has left (see
:mod:`shardstream.streaming.planning.passes`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shardstream.errors import ConfigError
from shardstream.streaming.control.controller import PassControl
from shardstream.streaming.control.state import PassState, encode_state, layout_from_dict
from shardstream.streaming.planning.passes import PassRecord
from shardstream.streaming.planning.split import Layout

__all__ = ["LoaderPosition"]


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
        total = self._pass_steps(num_workers)
        if total is None or self._state is None:
            return None
        return sum(record.consumed_steps for record in self._state.history) + total

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
        self._state = self._planned(state, num_workers)
        self._pass_steps(num_workers)  # the plan made here, before workers fork: they share it
        self._finished = False
        channel.post(self._state.as_dict())

    def advance(self) -> None:
        """One more step of the pass was consumed."""
        if self._state is not None:
            self._state = dataclasses.replace(self._state, consumed=self._state.consumed + 1)

    def finish(self) -> None:
        """The pass ran to its end (the next one reads the next epoch)."""
        self._finished = True

    def state_dict(self, num_workers: int) -> dict[str, Any]:
        """The loader's state (a finished epoch saves as fully consumed)."""
        state = self._state or self._planned(PassState(self._control.epoch), num_workers)
        total = self._pass_steps(num_workers)
        if self._finished and total is not None:
            state = dataclasses.replace(state, consumed=total)
        layout = self._control.layout(num_workers)
        return encode_state(state, layout, self._inputs.fingerprint(state.dataset_version))

    def load_state_dict(
        self, state: dict[str, Any], num_workers: int, allow_new_batch_size: bool
    ) -> None:
        """Continue from :meth:`state_dict` at this layout (see the module docstring).

        Raises:
            ConfigError: As :meth:`.inputs.PassInputs.check_state`, or a dataset without
                counts is resumed at another layout.
        """
        current = self._control.layout(num_workers)
        number = self._inputs.check_state(
            state, current, elastic=True, allow_new_batch_size=allow_new_batch_size
        )
        restored = dataclasses.replace(PassState.from_dict(state), dataset_version=number)
        saved = layout_from_dict(state)
        if not self._inputs.counted:
            if saved != current or restored.history:
                raise ConfigError(
                    "cannot continue this epoch with another world size, worker count or batch "
                    "size: the source has no manifest, so the samples already read cannot be "
                    "known (run `shardstream index` on the shards to allow it)"
                )
        elif restored.plan is None or not _continues(restored.plan, current):
            record = PassRecord(restored.plan or saved, restored.consumed)
            restored = dataclasses.replace(
                restored, history=(*restored.history, record), plan=None, consumed=0
            )
        self._state = self._planned(restored, num_workers)
        self._finished = False
        self._pins_seen = self._inputs.channel.pin_count


def _continues(plan: Layout, physical: Layout) -> bool:
    """Whether ``physical`` can go on reading a pass planned for ``plan`` (same global batch)."""
    return (
        plan.world_size % physical.world_size == 0
        and plan.world_size * plan.batch_size == physical.world_size * physical.batch_size
    )
