"""Lightning: a callback that checks, at the first batch of a fit, that the loader resumed with
the trainer (needs ``lightning``; import it from here)."""

from __future__ import annotations

from typing import Any

import lightning.pytorch as pl

from shardstream.streaming._control.position import check_resumed
from shardstream.streaming._loader import StreamingDataLoader

__all__ = ["LoaderPositionCheck"]


class LoaderPositionCheck(pl.Callback):
    """Raise at the first training batch of a fit unless every ``StreamingDataLoader`` of the
    train loaders resumed at the trainer's epoch and batch.

    Lightning stores a ``StreamingDataLoader``'s state in every checkpoint and restores it on
    ``fit(ckpt_path=...)``; this callback catches the silent failures around that: a checkpoint
    without the loader's state (edited, or written by a wrapper that dropped it), or a loader
    restored from another checkpoint. Lightning fetches a batch ahead, so the loader's place is
    compared where its pass started, with ``trainer.current_epoch`` and the batch index. It
    compares a few integers once per fit.

    Examples:
        >>> trainer = L.Trainer(callbacks=[LoaderPositionCheck()])  # doctest: +SKIP
        >>> trainer.fit(model, ckpt_path="last.ckpt")  # doctest: +SKIP
    """

    def __init__(self) -> None:
        self._checked = False

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._checked = False  # once per fit

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._checked:
            return
        self._checked = True
        for loader in _streaming_loaders(trainer.train_dataloader):
            if loader.pass_start is not None:
                where = f"epoch {trainer.current_epoch}, batch {batch_idx}"
                check_resumed(
                    loader.pass_start, f"{where} (Lightning)", epoch=trainer.current_epoch,
                    epoch_batches=batch_idx,
                )  # fmt: skip


def _streaming_loaders(loaders: Any) -> list[StreamingDataLoader]:
    """The StreamingDataLoaders among Lightning's train loaders (one, or a collection)."""
    if isinstance(loaders, StreamingDataLoader):
        return [loaders]
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return [found for item in loaders for found in _streaming_loaders(item)]
    return []
