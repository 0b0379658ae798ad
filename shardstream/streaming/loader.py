"""StreamingDataLoader: a DataLoader that knows its place in the epoch, for checkpoints."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.utils.data

from shardstream.errors import ConfigError
from shardstream.streaming.dataset import StreamingDataset
from shardstream.streaming.planning.passes import Layout, PassRecord
from shardstream.streaming.resume import (
    STATE_VERSION,
    check_fingerprint,
    check_layout,
    check_version,
    history_from_state,
    layout_from_state,
)

__all__ = ["StreamingDataLoader"]


class StreamingDataLoader(torch.utils.data.DataLoader):
    """A DataLoader over a :class:`StreamingDataset` with ``state_dict``/``load_state_dict``.

    Each pass after a completed one reads the next epoch (``dataset.set_epoch(n)`` pins one
    instead). The state is a small dict of plain values: the epoch, the batches this rank
    consumed, the earlier passes of the epoch and the layout (world size, workers, batch
    size). It is the same on every rank, so a checkpoint written by rank 0 alone (Lightning)
    restores every rank. A restored loader continues the epoch exactly: at the same layout the
    rest of the epoch comes out as the uninterrupted run would have yielded it; at another
    world size or worker count (elastic resume) the samples not yet consumed are dealt afresh,
    equally to every rank. Workers replay their shuffle on integers and re-read at most their
    shuffle buffer. ``persistent_workers=True`` is fine.

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
        self._epoch: int | None = None  # None: take the dataset's epoch at the first pass
        self._history: list[PassRecord] = []
        self._consumed = 0
        self._finished = False
        self._pins_seen = dataset.channel.pin_count

    def _layout(self) -> Layout:
        return self.dataset.layout(self.num_workers)

    def _pass_batches(self) -> int | None:
        if not self.dataset.counted or self._epoch is None:
            return None
        return self.dataset.pass_batches(self._epoch, self._history, self._layout())

    def __len__(self) -> int:
        """Batches of this epoch on this rank: those consumed in earlier passes plus this pass's.

        Equal to ``len(dataset)`` except in an epoch resumed at another layout, where it keeps
        a trainer's batch count (which includes the batches consumed before the restart) right.
        """
        total = self._pass_batches()
        if total is None:
            return len(self.dataset)
        return sum(record.consumed_batches for record in self._history) + total

    def _start_pass(self) -> None:
        """Choose this pass: a pinned epoch, the rest of the current one, or the next one."""
        dataset = self.dataset
        pinned = dataset.channel.pin_count != self._pins_seen
        self._pins_seen = dataset.channel.pin_count
        total = self._pass_batches()
        done = self._finished or (total is not None and self._consumed >= total)
        if self._epoch is None or (pinned and (dataset.epoch != self._epoch or done)):
            self._epoch, self._history, self._consumed = dataset.epoch, [], 0
        elif done:
            self._epoch, self._history, self._consumed = self._epoch + 1, [], 0
        self._finished = False
        dataset.channel.post(
            {
                "epoch": self._epoch,
                "history": [record.as_dict() for record in self._history],
                "consumed": self._consumed,
            }
        )

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # wraps the base iterator
        self._start_pass()
        for item in super().__iter__():
            self._consumed += 1
            yield item
        self._finished = True

    def state_dict(self) -> dict[str, Any]:
        """``{"version", "epoch", "consumed_batches", "history", layout, "fingerprint"}``.

        Plain values only (loads with ``torch.load(weights_only=True)``). A finished epoch
        saves as fully consumed, so a restore starts the next one.
        """
        epoch = self.dataset.epoch if self._epoch is None else self._epoch
        total = self._pass_batches()
        consumed = total if self._finished and total is not None else self._consumed
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "consumed_batches": consumed,
            "history": [record.as_dict() for record in self._history],
            **self._layout().as_dict(),
            "fingerprint": self.dataset.fingerprint(),
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
                ``allow_new_batch_size`` (names the field and both values).
        """
        check_version(state)
        check_fingerprint(state["fingerprint"], self.dataset.fingerprint())
        saved, current = layout_from_state(state), self._layout()
        check_layout(saved, current, elastic=True, allow_new_batch_size=allow_new_batch_size)
        history, consumed = history_from_state(state), int(state["consumed_batches"])
        if saved != current:  # the rest of the epoch becomes a new pass at the new layout
            history, consumed = [*history, PassRecord(saved, consumed)], 0
        self._epoch, self._history, self._consumed = int(state["epoch"]), history, consumed
        self._finished = False
        self._pins_seen = self.dataset.channel.pin_count
