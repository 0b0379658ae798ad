"""StreamingDataset: wires shard list, split plan, worker pipeline, decoding and batching."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch.utils.data

from shardstream.errors import ConfigError
from shardstream.storage import ReadOptions
from shardstream.streaming import batch as batching
from shardstream.streaming.context import Context, current_context
from shardstream.streaming.decode import SampleConverter
from shardstream.streaming.pipeline import WorkerJob, run_worker
from shardstream.streaming.shardlist import Source, resolve_source
from shardstream.streaming.split import (
    Piece,
    PlanOptions,
    batches_consumed_per_worker,
    next_worker,
    plan_whole_shards,
    plan_worker,
    rank_batch_count,
    samples_per_rank,
    worker_batch_counts,
)
from shardstream.streaming.tario import DEFAULT_MAX_MEMBER_BYTES

__all__ = ["StreamOptions", "StreamingDataset"]

logger = logging.getLogger("shardstream.streaming")


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    """Less common settings of :class:`StreamingDataset`.

    Attributes:
        shuffle_buffer: Samples held by the shuffle buffer (encoded bytes; bounds memory).
        num_open: Pieces each worker reads at once when shuffling (mixes class-ordered shards;
            each open piece holds one file handle or stream).
        piece_size: Longest run of consecutive samples taken from one place of a shard (capped
            by ``block_size``). Larger means fewer seeks (remote: fewer ranged requests) but
            needs more ``num_open`` for the same class mix: 64/64 measured 0.82 of uniform on
            class-ordered shards (16/32: 0.88, 64/32: 0.74).
        block_size: Samples dealt to a worker at a time (rounded up to the batch size).
        rank: This process's rank; with ``world_size`` overrides ``torch.distributed``.
        world_size: Number of ranks.
        output: ``"pair"`` yields ``(image, label)``; ``"dict"`` yields every field.
        allow_pickle: Unpickle ``.pyd``/``.pth`` members (runs code from the data; opt in only
            for data you trust).
        max_member_bytes: Largest tar member read into memory (1 GiB). A header declaring more,
            or more than the rest of the shard, is a ``ShardFormatError`` (skipped and counted
            with ``on_error="skip"``), so a corrupt or hostile shard cannot exhaust memory.
        storage_options: fsspec options for remote URLs.
        read_options: Retries, read-ahead and cache for remote reads.
    """

    shuffle_buffer: int = 1000
    num_open: int = 64
    piece_size: int = 64
    block_size: int = 64
    rank: int | None = None
    world_size: int | None = None
    output: str = "pair"
    allow_pickle: bool = False
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    storage_options: Mapping[str, Any] | None = None
    read_options: ReadOptions | None = None


class StreamingDataset(torch.utils.data.IterableDataset):
    """Stream WebDataset shards into PyTorch with exact, equal and resumable epochs.

    With a manifest (a folder written by :func:`shardstream.build_shards`), every rank yields the
    same number of samples and batches per epoch, ``len()`` says how many (batches when
    ``batch_size`` is set, else samples, per rank), and a :class:`StreamingDataLoader` can resume
    mid-epoch. Without one (a brace pattern or a URL list, e.g. shards from other tools), counts
    are unknown: there is no ``len()``, ranks may get different counts, and whole shards are
    dealt to ranks and workers.

    Args:
        source: Dataset folder/URL with ``manifest.json``, a brace pattern of shard URLs, or a
            list of shard URLs.
        shuffle: Shuffle shard order, pieces and samples per epoch (seeded; see ``set_epoch``).
        seed: Seed of every random choice; identical on every rank.
        decode: ``"raw"`` bytes, ``"pil"``, ``"rgb8"`` (uint8 CHW tensor) or ``f(bytes, ext)``.
        transform: Applied to each decoded image (torchvision v2 transforms work). A v2
            ``Compose`` starting with ``RandomResizedCrop`` takes a faster path that draws the
            crop first and decodes JPEGs at the lowest resolution that keeps it (see
            :mod:`shardstream.streaming.fastcrop`); ``Resize`` first decodes at reduced scale.
        batch_size: Collate this many samples inside the workers (use ``DataLoader(...,
            batch_size=None)``); None yields single samples.
        policy: ``"pad"`` (every sample at least once, < world_size repeated) or ``"drop"``
            (every sample at most once, < world_size left out).
        on_error: ``"raise"`` (default) or ``"skip"`` corrupt samples and truncated shards,
            logging and counting them.
        options: Less common settings, see :class:`StreamOptions`.

    Example:
        >>> ds = StreamingDataset("data/train", seed=0, batch_size=256)  # doctest: +SKIP
        >>> loader = StreamingDataLoader(ds, num_workers=8, pin_memory=True)  # doctest: +SKIP
        >>> for epoch in range(90):  # doctest: +SKIP
        ...     ds.set_epoch(epoch)
        ...     for images, labels in loader: ...
    """

    def __init__(
        self,
        source: Source,
        *,
        shuffle: bool = True,
        seed: int = 0,
        decode: str | Callable[[bytes, str], Any] = "rgb8",
        transform: Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        policy: str = "pad",
        on_error: str = "raise",
        options: StreamOptions | None = None,
    ) -> None:
        self.options = options or StreamOptions()
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        self.plan = PlanOptions(
            seed, shuffle, policy, batch_size or 1, self.options.block_size, self.options.piece_size
        )
        self.store, self.shards, self.manifest = resolve_source(
            source, self.options.storage_options, self.options.read_options
        )
        self.convert = SampleConverter(
            decode, transform, self.options.output, self.options.allow_pickle
        )
        self.batch_size = batch_size
        self.on_error = on_error
        self.epoch = 0
        self._resume: tuple[int, int] | None = None
        # DataLoader workers do not see torch.distributed: read rank and world size here, in the
        # training process (again in set_epoch), and hand them to the workers with the dataset.
        self._ranks = self._read_ranks()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch (shard order and shuffles); call before iterating each epoch."""
        self.epoch = int(epoch)
        self._ranks = self._read_ranks()

    def _read_ranks(self) -> tuple[int, int]:
        context = current_context(self.options.rank, self.options.world_size)
        return context.rank, context.world_size

    def context(self) -> Context:
        """Rank, world size (as seen by the training process) and the current worker."""
        return current_context(*self._ranks)

    def resume_at(self, epoch: int, batches_consumed: int) -> None:
        """Make the next iteration of ``epoch`` skip what this rank's loader already consumed.

        Used by :class:`StreamingDataLoader`; "batches" are samples when ``batch_size`` is None.
        """
        self.set_epoch(epoch)
        self._resume = (int(epoch), int(batches_consumed))

    def samples_per_rank(self, context: Context | None = None) -> int:
        """Samples each rank yields per epoch (requires a manifest)."""
        context = context or self.context()
        return samples_per_rank(self._num_samples(), context.world_size, self.plan.policy)

    def __len__(self) -> int:
        """Batches per rank per epoch when ``batch_size`` is set, else samples per rank."""
        per_rank = self.samples_per_rank()
        return rank_batch_count(per_rank, self.plan) if self.batch_size else per_rank

    def _num_samples(self) -> int:
        if self.manifest is None:
            raise TypeError(
                "this StreamingDataset has no manifest (it reads a shard pattern or URL list), so "
                "its length is unknown; build with shardstream (or add a manifest) for len(), "
                "equal per-rank counts and exact epochs"
            )
        return self.manifest.num_samples

    def __iter__(self) -> Iterator[Any]:
        context = self.context()
        resume = self._resume if self._resume and self._resume[0] == self.epoch else None
        consumed = resume[1] if resume else 0
        job = self._job(context, consumed)
        collate = (
            batching.collate_pairs if self.options.output == "pair" else batching.collate_dicts
        )
        return run_worker(job, self.convert, self.batch_size, collate)

    def _job(self, context: Context, consumed_batches: int) -> WorkerJob:
        worker_count = context.num_workers
        batch_counts = self._batch_counts(context, consumed_batches)
        rotation = next_worker(batch_counts, consumed_batches)
        context = dataclasses.replace(context, worker=(context.worker + rotation) % worker_count)
        if self.manifest is not None:
            counts = [spec.num_samples or 0 for spec in self.shards]
            pieces = plan_worker(
                counts,
                self.epoch,
                context.rank,
                context.world_size,
                context.worker,
                worker_count,
                self.plan,
            )
        else:
            pieces = self._whole_shards(context)
        taken = batches_consumed_per_worker(batch_counts, consumed_batches)[context.worker]
        return WorkerJob(
            store=self.store,
            shards=self.shards,
            pieces=tuple(pieces),
            seed=(self.plan.seed, self.epoch, context.rank, context.worker),
            shuffle=self.plan.shuffle,
            num_open=self.options.num_open,
            buffer_size=self.options.shuffle_buffer,
            skip_samples=taken * self.plan.batch_size,
            on_error=self.on_error,
            max_member_bytes=self.options.max_member_bytes,
        )

    def _batch_counts(self, context: Context, consumed_batches: int) -> list[int]:
        if self.manifest is None:  # unknown: assume no worker ran out before the resume point
            return [consumed_batches + 1] * context.num_workers
        return worker_batch_counts(self.samples_per_rank(context), context.num_workers, self.plan)

    def _whole_shards(self, context: Context) -> list[Piece]:
        if len(self.shards) < context.world_size * context.num_workers:
            logger.warning(
                "%d shards for %d ranks x %d workers and no manifest: some workers get no data "
                "and ranks may see different sample counts",
                len(self.shards),
                context.world_size,
                context.num_workers,
            )
        return plan_whole_shards(
            len(self.shards),
            self.epoch,
            context.rank,
            context.world_size,
            context.worker,
            context.num_workers,
            self.plan,
        )
