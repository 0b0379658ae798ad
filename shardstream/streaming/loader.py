"""StreamingDataLoader: a DataLoader that knows its place in the epoch, for checkpoints."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch.utils.data

from shardstream.errors import ConfigError
from shardstream.streaming.dataset import StreamingDataset
from shardstream.streaming.planning.passes import PassRecord
from shardstream.streaming.planning.split import Layout
from shardstream.streaming.resumestate import (
    STATE_VERSION,
    PassState,
    check_fingerprint,
    check_layout,
    check_version,
    layout_from_dict,
)
from shardstream.streaming.stats import LoaderStats

__all__ = ["StreamingDataLoader"]


class StreamingDataLoader(torch.utils.data.DataLoader):
    """A DataLoader over a :class:`StreamingDataset` with ``state_dict``/``load_state_dict``.

    Each pass after a completed one reads the next epoch (``dataset.set_epoch(n)`` pins one
    instead). The state is a small dict of plain values: the epoch, the steps this rank
    consumed, the earlier passes of the epoch and the layouts. It is the same on every rank, so
    a checkpoint written by rank 0 alone (Lightning) restores every rank, and its size does not
    grow with the dataset. A restored loader continues the epoch exactly: at the same world size
    (any worker count), or at one that divides the pass's planned world size with the same
    global batch, the rest of the epoch comes out as the uninterrupted run would have yielded
    it; at any other layout (elastic resume) the samples not yet consumed are dealt afresh,
    equally to every rank. Nothing is replayed: a worker starts at its next step.
    ``persistent_workers=True`` is fine.

    Args:
        dataset: The dataset; it batches inside the workers (this loader uses
            ``batch_size=None``).
        **kwargs: DataLoader arguments (``num_workers``, ``pin_memory``, ``persistent_workers``).

    Example:
        >>> loader = StreamingDataLoader(ds, num_workers=8)  # doctest: +SKIP
        >>> torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, path)
        >>> # after a restart, at any world size; plain data, so weights_only=True loads it
        >>> loader.load_state_dict(torch.load(path, weights_only=True)["loader"])
    """

    dataset: StreamingDataset

    def __init__(self, dataset: StreamingDataset, **kwargs: Any) -> None:
        if kwargs.get("batch_size") is not None:
            raise ConfigError(
                "StreamingDataLoader batches inside the workers: pass batch_size to "
                "StreamingDataset and leave the loader's batch_size unset"
            )
        kwargs["batch_size"] = None
        super().__init__(dataset, **kwargs)
        self._state: PassState | None = None  # None: take the dataset's epoch at the first pass
        self._finished = False
        self._pins_seen = dataset.channel.pin_count
        self._stats = None
        if dataset.stats_board is not None:
            self._stats = LoaderStats(dataset, dataset.options.stats_interval_s)

    def _physical(self) -> Layout:
        return self.dataset.layout(self.num_workers)

    def _planned(self, state: PassState) -> PassState:
        """``state`` with its pass's plan layout fixed (a fresh pass: from this layout)."""
        if state.dataset_version is None:  # a fresh epoch reads the version the dataset opened
            state = dataclasses.replace(state, dataset_version=self.dataset.version)
        if state.plan is not None or not self.dataset.counted:
            return state
        return dataclasses.replace(state, plan=self.dataset.settings.plan_layout(self._physical()))

    def _pass_steps(self) -> int | None:
        if not self.dataset.counted or self._state is None:
            return None
        return self.dataset.plan(self._state, self._physical()).steps

    def __len__(self) -> int:
        """Batches of this epoch on this rank: those consumed in earlier passes plus this pass's.

        Equal to ``len(dataset)`` except in an epoch resumed at another layout, where it keeps
        a trainer's batch count (which includes the batches consumed before the restart) right.
        """
        total = self._pass_steps()
        if total is None or self._state is None:
            return len(self.dataset)
        return sum(record.consumed_steps for record in self._state.history) + total

    def _start_pass(self) -> None:
        """Choose this pass: a pinned epoch, the rest of the current one, or the next one."""
        dataset = self.dataset
        pinned = dataset.channel.pin_count != self._pins_seen
        self._pins_seen = dataset.channel.pin_count
        total = self._pass_steps()
        state = self._state
        done = self._finished or (
            total is not None and state is not None and state.consumed >= total
        )
        if state is None or (pinned and (dataset.epoch != state.epoch or done)):
            state = PassState(dataset.epoch)
        elif done:
            state = PassState(state.epoch + 1)
        self._state = self._planned(state)
        self._finished = False
        dataset.channel.post(self._state.as_dict())

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # wraps the base iterator
        self._start_pass()
        batches: Iterator[Any] = super().__iter__()
        if self._stats is not None:
            batches = self._stats.watch(batches)
        for item in batches:
            if self._state is not None:
                self._state = dataclasses.replace(self._state, consumed=self._state.consumed + 1)
            yield item
        self._finished = True

    def stats(self) -> dict[str, Any]:
        """Loader statistics as a plain dict (``StreamOptions(stats=True)``; see
        :mod:`shardstream.streaming.stats`): samples/s, data stall, worker stage times.

        Raises:
            ConfigError: Statistics are off.
        """
        if self._stats is None:
            raise ConfigError("statistics are off: make the dataset with StreamOptions(stats=True)")
        return self._stats.snapshot()

    def state_dict(self) -> dict[str, Any]:
        """``{"version", "epoch", "history", "plan", "consumed_batches", layout, "fingerprint"}``.

        Plain values only (loads with ``torch.load(weights_only=True)``). A finished epoch
        saves as fully consumed, so a restore starts the next one.
        """
        state = self._state or self._planned(PassState(self.dataset.epoch))
        total = self._pass_steps()
        if self._finished and total is not None:
            state = dataclasses.replace(state, consumed=total)
        return {
            "version": STATE_VERSION,
            **state.as_dict(),
            **self._physical().as_dict(),
            "fingerprint": self.dataset.fingerprint(state.dataset_version),
        }

    def load_state_dict(self, state: dict[str, Any], allow_new_batch_size: bool = False) -> None:
        """Continue from :meth:`state_dict`, at this loader's world size and worker count.

        Args:
            state: A state from :meth:`state_dict` (of any rank).
            allow_new_batch_size: Accept a state saved with another per-rank batch size (the
                rest of the epoch is then dealt in batches of the new size).

        Raises:
            ConfigError: The state is of another version, or the seed, dataset, policy or
                reading settings differ, or the batch size does without
                ``allow_new_batch_size`` (names the field and both values), or a dataset
                without counts is resumed at another layout.
        """
        check_version(state)
        number = self.dataset.versions.number_for(state)
        check_fingerprint(state["fingerprint"], self.dataset.fingerprint(number))
        saved, current = layout_from_dict(state), self._physical()
        check_layout(saved, current, elastic=True, allow_new_batch_size=allow_new_batch_size)
        restored = dataclasses.replace(PassState.from_dict(state), dataset_version=number)
        if not self.dataset.counted:
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
        self._state = self._planned(restored)
        self._finished = False
        self._pins_seen = self.dataset.channel.pin_count


def _continues(plan: Layout, physical: Layout) -> bool:
    """Whether ``physical`` can go on reading a pass planned for ``plan`` (same global batch)."""
    return (
        plan.world_size % physical.world_size == 0
        and plan.world_size * plan.batch_size == physical.world_size * physical.batch_size
    )
