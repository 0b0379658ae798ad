"""The thread loader: a rank's workers as threads of the training process, batches in order.

``StreamingDataLoader(ds, num_threads=N)`` reads, decodes and collates on N threads, each
playing one DataLoader worker (``control/context.py: worker_thread``): the same plan, the same
steps per worker, the same channel and resume state as N worker processes. Batches are made in
this process's memory and handed over as they are (no pickling, no shared-memory copy; raw
images stay views of the shard files' memory maps). They come out as a DataLoader's do: worker
0's next batch, then worker 1's, ..., skipping workers that have finished, which is the pass's
step order.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Generator, Iterator
from typing import Any

from shardstream.storage.background import BackgroundIterator
from shardstream.streaming.control.context import worker_thread

__all__ = ["thread_batches"]

logger = logging.getLogger("shardstream.streaming")

#: How long a stop waits for a thread to finish the batch it is making (a read that hangs on
#: a store ends by the store's own timeouts; the loop is not held up for longer).
_STOP_WAIT_S = 30.0


def thread_batches(
    dataset: Any, num_threads: int, depth: int = 2, pin_memory: bool = False
) -> Generator[Any, None, None]:
    """One pass of ``dataset`` read by ``num_threads`` worker threads, in step order.

    Closing the generator (a ``break``, an exception in the loop) stops every thread at its
    next batch and waits for it; an exception on a thread is raised here at its batch.

    Args:
        dataset: A :class:`~shardstream.streaming.StreamingDataset` (or any iterable dataset
            whose passes read the worker's place from ``current_context``).
        num_threads: Worker threads.
        depth: Batches each thread makes ahead (a DataLoader's ``prefetch_factor``).
        pin_memory: Pin each batch's tensors on its thread (when CUDA is available).
    """
    pin = pin_memory and _cuda_available()
    stages = [
        BackgroundIterator(
            functools.partial(_worker_items, dataset, pin),
            depth,
            name=f"shardstream-worker-{worker}",
            setup=functools.partial(worker_thread, worker, num_threads),
        )
        for worker in range(num_threads)
    ]
    try:
        active = list(stages)
        while active:
            for stage in list(active):  # one turn each, as a DataLoader asks its workers
                try:
                    item = next(stage)
                except StopIteration:
                    active.remove(stage)
                    continue
                yield item
    finally:
        for stage in stages:
            stage.stop()  # every thread told first, then each waited for
        for worker, stage in enumerate(stages):
            stage.close(timeout_s=_STOP_WAIT_S)
            if stage.running:
                logger.warning(
                    "worker thread %d is still making a batch %.0f s after the loop stopped; "
                    "it stops when that batch is made (its result is dropped)",
                    worker, _STOP_WAIT_S,
                )  # fmt: skip


def _worker_items(dataset: Any, pin: bool) -> Iterator[Any]:
    """The worker's pass (called on its thread, inside its ``worker_thread`` block)."""
    items = iter(dataset)
    return _pinned(items) if pin else items


def _pinned(items: Iterator[Any]) -> Iterator[Any]:
    from torch.utils.data._utils.pin_memory import pin_memory

    try:
        for item in items:
            yield pin_memory(item)
    finally:
        close = getattr(items, "close", None)
        if close is not None:
            close()


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
