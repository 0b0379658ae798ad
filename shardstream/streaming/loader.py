"""StreamingDataLoader: a DataLoader that knows its position in the epoch, for checkpoints."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch.utils.data

from shardstream.errors import ConfigError
from shardstream.streaming.dataset import StreamingDataset

__all__ = ["StreamingDataLoader"]

STATE_VERSION = 1


class StreamingDataLoader(torch.utils.data.DataLoader):
    """A DataLoader over a :class:`StreamingDataset` with ``state_dict``/``load_state_dict``.

    The state is a small dict (epoch, batches consumed on this rank, and a fingerprint of the
    settings that fix the sample order). Because the order is a pure function of those, a
    restored loader yields exactly the batches the uninterrupted run would have yielded for the
    rest of the epoch; each worker replays its shuffle on integers and re-reads at most its
    shuffle buffer. Save one state per rank (they are equal on every rank).

    Args:
        dataset: The dataset; batch it with its own ``batch_size`` (this loader uses
            ``batch_size=None``).
        **kwargs: DataLoader arguments (``num_workers``, ``pin_memory``, ...).
            ``persistent_workers`` is refused: workers would keep a stale epoch.

    Example:
        >>> loader = StreamingDataLoader(ds, num_workers=8)  # doctest: +SKIP
        >>> torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, path)
        >>> # after a restart; the loader state is plain data, so weights_only=True loads it
        >>> loader.load_state_dict(torch.load(path, weights_only=True)["loader"])
    """

    def __init__(self, dataset: StreamingDataset, **kwargs: Any) -> None:
        if kwargs.get("batch_size") is not None:
            raise ConfigError(
                "StreamingDataLoader batches inside the workers: pass batch_size to "
                "StreamingDataset and leave the loader's batch_size unset"
            )
        if kwargs.get("persistent_workers"):
            raise ConfigError(
                "persistent_workers=True keeps the workers' copy of the dataset, so set_epoch() "
                "and resume would not reach them; leave it off (workers start in well under a "
                "second per epoch)"
            )
        kwargs["batch_size"] = None
        super().__init__(dataset, **kwargs)
        self._epoch = dataset.epoch
        self._consumed = 0
        self._finished = False

    def _fingerprint(self) -> dict[str, Any]:
        dataset: StreamingDataset = self.dataset  # type: ignore[assignment]
        context = dataset.context()
        plan = dataset.plan
        return {
            "seed": plan.seed,
            "shuffle": plan.shuffle,
            "policy": plan.policy,
            "batch_size": dataset.batch_size,
            "world_size": context.world_size,
            "num_workers": max(1, self.num_workers),
            "num_shards": len(dataset.shards),
            "num_samples": dataset.manifest.num_samples if dataset.manifest else None,
            "shuffle_buffer": dataset.options.shuffle_buffer,
            "num_open": dataset.options.num_open,
            "piece_size": dataset.options.piece_size,
            "block_size": dataset.options.block_size,
        }

    def state_dict(self) -> dict[str, Any]:
        """``{"version", "epoch", "batches_consumed", "fingerprint"}`` (plain values only)."""
        self._sync_epoch()
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "batches_consumed": self._consumed,
            "fingerprint": self._fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from :meth:`state_dict`; the next iteration resumes that epoch.

        Raises:
            ConfigError: The state came from a run with different settings (names the field,
                the saved and the current value).
        """
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"loader state version {state.get('version')!r} is not supported")
        current = self._fingerprint()
        for name, saved in state["fingerprint"].items():
            if current.get(name) != saved:
                raise ConfigError(
                    f"cannot resume: {name} was {saved!r} when the state was saved but is "
                    f"{current.get(name)!r} now; the sample order depends on it, so restart with "
                    f"{name}={saved!r} (or start the epoch over without load_state_dict)"
                )
        self._epoch, self._consumed = int(state["epoch"]), int(state["batches_consumed"])
        self._finished = False
        self.dataset.set_epoch(self._epoch)  # type: ignore[attr-defined]

    def _sync_epoch(self) -> None:
        epoch = self.dataset.epoch  # type: ignore[attr-defined]
        if epoch != self._epoch:
            self._epoch, self._consumed, self._finished = epoch, 0, False

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # wraps the base iterator
        self._sync_epoch()
        if self._finished:
            self._consumed, self._finished = 0, False
        dataset: StreamingDataset = self.dataset  # type: ignore[assignment]
        dataset.resume_at(self._epoch, self._consumed)
        try:
            iterator = super().__iter__()  # workers copy the dataset, resume point included
        finally:
            dataset._resume = None
        for item in iterator:
            self._consumed += 1
            yield item
        self._finished = True
