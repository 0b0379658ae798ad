"""One call after restoring a checkpoint: is the loader where the trainer is?

A resume can fail silently: a wrapper that drops the loader's state starts it at batch 0 while
the trainer is at step 5,000, or a state comes from another checkpoint than the model's. The
job then trains on the wrong data and exits 0. :func:`check_position` compares the loader's
position (:class:`~shardstream.streaming.control.position.Position`) with the trainer's step and
raises with both. It reads a few integers: it costs nothing, whatever the dataset's size.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardstream.errors import ConfigError
from shardstream.streaming.control.position import Position, check_resumed
from shardstream.streaming.control.resumestate import decode_pass
from shardstream.streaming.dataset import StreamingDataset
from shardstream.streaming.loader import StreamingDataLoader

__all__ = ["Position", "check_position", "loader_position"]


def check_position(loader: Any, step: int, grad_accumulation: int = 1) -> Position:
    """Raise unless ``loader`` consumed ``step * grad_accumulation`` batches on this rank.

    Call it after restoring a checkpoint (model, optimizer and the loader's state), before the
    loop goes on; a fresh run passes with step 0.

    Args:
        loader: A :class:`~shardstream.StreamingDataLoader`, or torchdata's
            ``StatefulDataLoader`` over a :class:`~shardstream.StreamingDataset`.
        step: The trainer's optimizer steps, restored from the same checkpoint (a loop that
            counts batches passes its batch count and ``grad_accumulation=1``).
        grad_accumulation: Batches per optimizer step.

    Returns:
        The loader's position.

    Raises:
        ResumeError: The loader is elsewhere; the message names both positions.

    Examples:
        >>> loader.load_state_dict(checkpoint["loader"])  # doctest: +SKIP
        >>> check_position(loader, checkpoint["step"], grad_accumulation=4)  # doctest: +SKIP
    """
    if step < 0 or grad_accumulation < 1:
        raise ConfigError(
            f"check_position needs step >= 0 and grad_accumulation >= 1, got {step} and "
            f"{grad_accumulation}"
        )
    position = loader_position(loader)
    batches = step * grad_accumulation
    per_step = f" x {grad_accumulation} batches per step" if grad_accumulation > 1 else ""
    check_resumed(position, f"step {step}{per_step} ({batches} batches)", global_batches=batches)
    return position


def loader_position(loader: Any) -> Position:
    """The position of a ``StreamingDataLoader`` or of a ``StatefulDataLoader`` over a
    ``StreamingDataset`` (restored or not; nothing is iterated).

    Raises:
        ConfigError: Another kind of loader or dataset.
    """
    if isinstance(loader, StreamingDataLoader):
        return loader.position()
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, StreamingDataset) or not hasattr(loader, "next_iter_state"):
        raise ConfigError(
            f"check_position takes a StreamingDataLoader, or torchdata's StatefulDataLoader over "
            f"a StreamingDataset; got {type(loader).__name__} over {type(dataset).__name__}"
        )
    iterator = getattr(loader, "_iterator", None)  # torchdata keeps the live one there
    state = loader.next_iter_state if iterator is None else iterator.state_dict()
    return _stateful_position(dataset, state)


def _stateful_position(dataset: StreamingDataset, state: Mapping[str, Any] | None) -> Position:
    """A StatefulDataLoader's position from its state (restored, or of the live iterator): its
    batch count in the epoch, and the epoch its workers' dataset states read."""
    length = len(dataset) if dataset.counted else None
    if not state:  # not restored: where a fresh loader starts
        return Position(dataset.epoch, 0, dataset.epoch * (length or 0), length)
    snapshot = state.get("_snapshot")
    if snapshot is None:  # no workers: the loader's own counters and the dataset's state
        batches, dataset_states = int(state["_num_yielded"]), [state.get("dataset_state")]
    else:
        batches = int(snapshot["_snapshot_step"]) + int(state["_steps_since_snapshot"])
        workers = snapshot["_worker_snapshots"].values()
        dataset_states = [worker.get("dataset_state") for worker in workers]
    epochs = [decode_pass(item).epoch for item in dataset_states if item]
    epoch = max(epochs) if epochs else dataset.epoch
    # A StatefulDataLoader resumes at the same layout only, so every epoch had this length.
    total = epoch * (length or 0) + batches
    if state.get("_iterator_finished") or (length is not None and batches >= length):
        return Position(epoch + 1, 0, total, length)  # the next batch is the next epoch's
    return Position(epoch, batches, total, length)
