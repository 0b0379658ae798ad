"""The thread loader: a rank's workers as threads of the training process, batches in order.

``StreamingDataLoader(ds, num_threads=N)`` reads, decodes and collates on N threads, each
playing one DataLoader worker (``control/context.py: worker_thread``): the same plan, the same
steps per worker, the same channel and resume state as N worker processes. Batches are made in
this process's memory and handed over as they are (no pickling, no shared-memory copy; raw
images stay views of the shard files' memory maps). They come out as a DataLoader's do: worker
0's next batch, then worker 1's, ..., skipping workers that have finished, which is the pass's
step order.

StreamingDataLoader: a DataLoader that knows its place in the epoch, for checkpoints."""

from __future__ import annotations

import functools
import logging
from collections.abc import Generator, Iterator
from typing import Any

import torch.utils.data

from shardstream._catalog.shardlist import cut_shards
from shardstream._storage.background import BackgroundIterator
from shardstream.errors import ConfigError, ShardFormatError
from shardstream.streaming._control.context import MAX_WORKERS, worker_thread
from shardstream.streaming._control.position import LoaderPosition, Position
from shardstream.streaming._dataset import StreamingDataset
from shardstream.streaming._diagnostics.stats import LoaderStats
from shardstream.streaming._worker.batch import lost_in

__all__ = [
    "StreamingDataLoader",
    "thread_batches",
]


logger = logging.getLogger("shardstream.streaming")

#: How long a stop waits for a thread to finish the batch it is making (a read that hangs on
#: a store ends by the store's own timeouts; the loop is not held up for longer).
_STOP_WAIT_S = 30.0


def thread_batches(
    dataset: Any, num_threads: int, depth: int = 2, pin_memory: bool = False
) -> Generator[Any, None, None]:
    """One pass of ``dataset`` read by ``num_threads`` worker threads, in step order.

    Closing the generator (a ``break``, an exception in the loop) stops every thread at its
    next batch and waits for it; an exception on a thread is raised here at its batch. A
    batch whose raw images view memory-mapped shard bytes that their file lost since the
    batch was made raises :class:`~shardstream.errors.ShardFormatError` here, also with
    ``on_error="skip"`` (touching them would kill the process with SIGBUS).

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
                lost = lost_in(item)  # views of a shard file cut since the batch was made
                if lost is not None:
                    raise ShardFormatError(lost)
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
    ``persistent_workers=True`` is fine. With ``decode="cuda"`` it decodes each batch on the GPU
    as it hands it over (:class:`~shardstream.GpuDecode`), the next
    batch enqueued while the training step runs; the state counts only batches handed over.

    ``num_threads=N`` reads with N threads of the training process instead of worker
    processes: each thread plays one worker, so
    the epoch, its order, the errors and skips and the state are those of ``num_workers=N``
    (a state saved with workers resumes with threads and back), while batches are handed over
    without a copy: raw images stay views of the shard files. Decoding and transforms release
    the GIL for most of their time, so threads scale until the Python parts meet; see the
    guide for when to choose which. Random transforms draw from the training process's torch
    RNG (worker processes each seed their own).

    Args:
        dataset: The dataset; it batches inside the workers (this loader uses
            ``batch_size=None``).
        num_threads: Read with this many threads of the training process (0: as the
            DataLoader does, with ``num_workers`` processes, or in the loop itself). Not with
            ``num_workers``; ``prefetch_factor`` is the batches each thread makes ahead
            (default 2) and ``pin_memory`` pins each batch on its thread.
        **kwargs: DataLoader arguments (``num_workers``, ``pin_memory``, ``persistent_workers``).

    Examples:
        >>> loader = StreamingDataLoader(ds, num_workers=8)  # doctest: +SKIP
        >>> torch.save({"model": model.state_dict(), "loader": loader.state_dict()}, path)
        >>> # after a restart, at any world size; plain data, so weights_only=True loads it
        >>> loader.load_state_dict(torch.load(path, weights_only=True)["loader"])
        >>> threads = StreamingDataLoader(ds, num_threads=4, pin_memory=True)  # doctest: +SKIP
    """

    dataset: StreamingDataset

    def __init__(self, dataset: StreamingDataset, num_threads: int = 0, **kwargs: Any) -> None:
        if kwargs.get("batch_size") is not None:
            raise ConfigError(
                "StreamingDataLoader batches inside the workers: pass batch_size to "
                "StreamingDataset and leave the loader's batch_size unset"
            )
        kwargs["batch_size"] = None
        self._thread_depth, self._thread_pin = _thread_options(num_threads, kwargs)
        super().__init__(dataset, **kwargs)
        #: Worker threads of the training process (0: worker processes, or none).
        self.num_threads = num_threads
        self._position = LoaderPosition(dataset.control)
        self._stats = None
        if dataset.stats_board is not None:
            self._stats = LoaderStats(dataset, dataset.options.stats_interval_s)

    def __repr__(self) -> str:
        return (
            f"StreamingDataLoader({self.dataset!r}, num_workers={self.num_workers}, "
            f"num_threads={self.num_threads}, persistent_workers={self.persistent_workers}, "
            f"pin_memory={self.pin_memory})"
        )

    def __len__(self) -> int:
        """Batches of this epoch on this rank: those consumed in earlier passes plus this pass's.

        Equal to ``len(dataset)`` except in an epoch resumed at another layout, where it keeps
        a trainer's batch count (which includes the batches consumed before the restart) right.
        """
        total = self._position.epoch_steps(self._readers)
        return len(self.dataset) if total is None else total

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]  # wraps the base iterator
        # Processes that outlive the pass fetch the next pass's first pieces as this one ends.
        ahead = self.num_workers == 0 or self.persistent_workers  # threads: the process stays
        self.dataset.control.inputs.channel.set_ahead(ahead)
        self._position.start_pass(self._readers)
        threads = None
        if self.num_threads:
            threads = thread_batches(
                self.dataset, self.num_threads, self._thread_depth, self._thread_pin
            )
        batches: Iterator[Any] = threads if threads is not None else super().__iter__()
        if self._stats is not None:
            batches = self._stats.watch(batches)
        if self.dataset.gpu_decode is not None:  # decode="cuda": one batch ahead on the GPU
            batches = self.dataset.gpu_decode.batches(batches)
        try:
            for item in batches:
                self._position.advance()
                yield item
        except RuntimeError as error:  # torch's words for a worker killed by a signal
            cut = _cut_shards_behind(self.dataset, error)
            if cut is None:
                raise
            raise cut from error
        finally:  # a break or an error: the threads stop now, not when collected
            if threads is not None:
                # The GPU stage's thread may be pulling from the threads: stop it first (a
                # generator running on another thread cannot be closed).
                close_outer = getattr(batches, "close", None)
                if batches is not threads and close_outer is not None:
                    close_outer()
                threads.close()
        self._position.finish()

    @property
    def _readers(self) -> int:
        """The workers of this loader's layout: threads, else DataLoader worker processes."""
        return self.num_threads or self.num_workers

    def stats(self) -> dict[str, Any]:
        """Loader statistics as a plain dict (``StreamOptions(stats=True)``): samples/s, data
        stall, worker stage times.

        Raises:
            ConfigError: Statistics are off.
        """
        if self._stats is None:
            raise ConfigError("statistics are off: make the dataset with StreamOptions(stats=True)")
        return self._stats.snapshot()

    def position(self) -> Position:
        """This rank's place in trainer terms: epoch, batches consumed in it and in all.

        After ``load_state_dict`` it is the restored place; check it against the trainer's
        step with :func:`~shardstream.check_position`.

        Examples:
            >>> loader.position()  # doctest: +SKIP
            Position(epoch=1, epoch_batches=2, global_batches=9, epoch_length=7)
        """
        return self._position.position(self._readers)

    def state_dict(self) -> dict[str, Any]:
        """``{"version", "epoch", "history", "plan", "consumed_batches", layout, "fingerprint",
        "global_batches"}``.

        Plain values only (loads with ``torch.load(weights_only=True)``). A finished epoch
        saves as fully consumed, so a restore starts the next one.
        """
        return self._position.state_dict(self._readers)

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
        self._position.load_state_dict(state, self._readers, allow_new_batch_size)

    @property
    def pass_start(self) -> Position | None:
        """Where the pass under way started (after a restore, the restored place), or None
        before the first pass: a trainer that fetches batches ahead compares this one."""
        return self._position.pass_start


def _cut_shards_behind(dataset: StreamingDataset, error: RuntimeError) -> ShardFormatError | None:
    """The error to raise instead of torch's when a DataLoader worker died of a bus error
    (SIGBUS: "killed by signal: Bus error", which torch blames on shared memory) and local
    shards are now shorter than their manifest says: a memory-mapped file cut while it was read
    kills its reader that way. None otherwise (torch's error stands)."""
    cause = error.__cause__
    if "Bus error" not in f"{error} {cause if cause is not None else ''}":
        return None
    cut = cut_shards(dataset.shards.sources)
    if not cut:
        return None
    return ShardFormatError(
        f"a DataLoader worker was killed by a bus error (SIGBUS) while shard files it reads "
        f"through memory maps are shorter than their manifest says: {', '.join(cut)}. A shard "
        "cut or rewritten in place while it is read (a build or copy into the same file, an "
        "rsync or sync under way) kills its reader. Replace shards by renaming a new file over "
        "them, check them with `shardstream verify`, or pass StreamOptions(memory_map=False) "
        "to read instead of mapping."
    )


def _thread_options(num_threads: int, kwargs: dict[str, Any]) -> tuple[int, bool]:
    """Check ``num_threads`` against the DataLoader ``kwargs``; take the options threads use
    out of them: ``(batches each thread makes ahead, pin on the threads)``."""
    if not isinstance(num_threads, int) or not 0 <= num_threads <= MAX_WORKERS:
        raise ConfigError(f"num_threads must be an int in [0, {MAX_WORKERS}], got {num_threads!r}")
    if not num_threads:
        return 0, False
    if kwargs.get("num_workers"):
        raise ConfigError(
            f"num_threads={num_threads} and num_workers={kwargs['num_workers']}: read with "
            "threads or with worker processes, not both (set one of them to 0)"
        )
    depth = kwargs.pop("prefetch_factor", None) or 2
    kwargs.pop("persistent_workers", None)  # threads read in the training process, which stays
    return int(depth), bool(kwargs.pop("pin_memory", False))
