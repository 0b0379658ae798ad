"""StreamingDataset: wires shard list, pass plan, worker pipeline, decoding and batching."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch.utils.data

from shardstream.errors import ConfigError
from shardstream.format.manifest import Manifest
from shardstream.streaming.context import Context, current_context
from shardstream.streaming.decoding.decode import SampleConverter
from shardstream.streaming.mixture import Mixture, Stream
from shardstream.streaming.options import StreamOptions
from shardstream.streaming.planning.passes import (
    Layout,
    PassRecord,
    StageOptions,
    WorkerPlan,
    last_worker,
    pass_batches,
    pass_sequence,
    plan_pass_worker,
    plan_whole_shards_worker,
)
from shardstream.streaming.planning.split import (
    Piece,
    PlanOptions,
    epoch_sequence,
    rank_batch_count,
    samples_per_rank,
)
from shardstream.streaming.resume import (
    STATE_VERSION,
    check_fingerprint,
    check_layout,
    check_version,
    history_from_state,
    layout_from_state,
)
from shardstream.streaming.shardlist import Source, resolve_source
from shardstream.streaming.worker import batch as batching
from shardstream.streaming.worker.channel import EpochChannel
from shardstream.streaming.worker.pipeline import WorkerJob, run_worker

__all__ = ["StreamOptions", "StreamingDataset"]

logger = logging.getLogger("shardstream.streaming")


class StreamingDataset(torch.utils.data.IterableDataset):
    """Stream WebDataset shards into PyTorch with exact, equal and resumable epochs.

    With a manifest (a folder written by :func:`shardstream.build_shards`), every rank yields the
    same number of samples and batches per epoch, ``len()`` says how many (batches when
    ``batch_size`` is set, else samples, per rank), and a :class:`StreamingDataLoader` can resume
    mid-epoch. Without one (a brace pattern or a URL list, e.g. shards from other tools), counts
    are unknown: there is no ``len()``, ranks may get different counts, and whole shards are
    dealt to ranks and workers.

    Args:
        source: Dataset folder/URL with ``manifest.json``, a brace pattern of shard URLs, a
            list of shard URLs, or a list of :class:`Stream` (a mixture, see
            :mod:`shardstream.streaming.mixture`).
        shuffle: Shuffle shard order, pieces and samples per epoch (seeded; see ``set_epoch``).
        seed: Seed of every random choice; identical on every rank.
        decode: ``"raw"`` bytes, ``"pil"``, ``"rgb8"`` (uint8 CHW tensor) or ``f(bytes, ext)``.
        transform: Applied to each decoded image (torchvision v2 transforms work). A v2
            ``Compose`` starting with ``RandomResizedCrop`` takes a faster path that draws the
            crop first and decodes JPEGs at the lowest resolution that keeps it (see
            :mod:`shardstream.streaming.decoding.fastcrop`); ``Resize`` first decodes at reduced
            scale.
        batch_size: Collate this many samples inside the workers (use ``DataLoader(...,
            batch_size=None)``); None yields single samples.
        policy: ``"pad"`` (every sample at least once, < world_size repeated) or ``"drop"``
            (every sample at most once, < world_size left out).
        on_error: ``"raise"`` (default) or ``"skip"`` corrupt samples and truncated shards,
            logging and counting them.
        options: Less common settings, see :class:`StreamOptions`.
        epoch_size: Samples per epoch over all ranks, for a mixture with proportions.

    Epochs: each new pass over the dataset moves to the next epoch by itself (new shard order
    and shuffles), whatever loader runs it and whether its workers persist; ``set_epoch(n)``
    pins the epoch instead, and reaches persistent workers too. The dataset follows the
    ``Stateful`` protocol (``state_dict``/``load_state_dict`` per worker), so torchdata's
    ``StatefulDataLoader`` resumes it mid-epoch exactly.

    Example:
        >>> ds = StreamingDataset("data/train", seed=0, batch_size=256)  # doctest: +SKIP
        >>> loader = StreamingDataLoader(ds, num_workers=8, pin_memory=True)  # doctest: +SKIP
        >>> for epoch in range(90):  # doctest: +SKIP
        ...     for images, labels in loader: ...
    """

    def __init__(
        self,
        source: Source | Stream | Sequence[Stream],
        *,
        shuffle: bool = True,
        seed: int = 0,
        decode: str | Callable[[bytes, str], Any] = "rgb8",
        transform: Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        policy: str = "pad",
        on_error: str = "raise",
        options: StreamOptions | None = None,
        epoch_size: int | None = None,
    ) -> None:
        self.options = options or StreamOptions()
        if on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {on_error!r}")
        if not 0 <= self.options.batch_buffers <= 64:
            raise ConfigError(f"batch_buffers must be in [0, 64], got {self.options.batch_buffers}")
        self.plan = PlanOptions(
            seed, shuffle, policy, batch_size or 1, self.options.block_size, self.options.piece_size
        )
        self.stage = StageOptions(shuffle, self.options.num_open, self.options.shuffle_buffer)
        self.mixture: Mixture | None = None
        self.manifest: Manifest | None = None
        streams = [source] if isinstance(source, Stream) else source
        if isinstance(streams, (list, tuple)) and any(isinstance(s, Stream) for s in streams):
            self.mixture = Mixture(_only_streams(streams), epoch_size, seed)
            self.stores, self.shards = tuple(self.mixture.stores), tuple(self.mixture.shards)
        else:
            if epoch_size is not None:
                raise ConfigError("epoch_size is for mixtures of Stream(...) sources")
            store, self.shards, self.manifest = resolve_source(
                cast(Source, source), self.options.storage_options, self.options.read_options
            )
            self.stores = (store,)
        self.convert = SampleConverter(
            decode,
            transform,
            self.options.output,
            self.options.allow_pickle,
            batch_size is not None,
        )
        self.batch_size = batch_size
        self.on_error = on_error
        self.channel = EpochChannel()
        self._pending: dict[str, Any] | None = None  # a Stateful restore, for the next pass
        self._progress: dict[str, Any] | None = None  # the pass under way in this process
        self._sequences: dict[tuple[int, tuple[PassRecord, ...]], list[Piece]] = {}
        # DataLoader workers do not see torch.distributed: read rank and world size here, in the
        # training process (again in set_epoch), and hand them to the workers with the dataset.
        self._ranks = self._read_ranks()

    # -- epochs and ranks ---------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch pinned by :meth:`set_epoch` (0 before any call)."""
        return self.channel.pinned

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` in the next pass (shard order and shuffles); later passes count on.

        Optional: passes advance by themselves. Reaches persistent DataLoader workers too.
        """
        self.channel.pin(int(epoch))
        self._ranks = self._read_ranks()

    def _read_ranks(self) -> tuple[int, int]:
        context = current_context(self.options.rank, self.options.world_size)
        return context.rank, context.world_size

    def context(self) -> Context:
        """Rank, world size (as seen by the training process) and the current worker."""
        return current_context(*self._ranks)

    def layout(self, num_workers: int | None = None) -> Layout:
        """World size, workers per rank and batch size of a pass (workers: the current ones)."""
        context = self.context()
        workers = context.num_workers if num_workers is None else max(1, num_workers)
        return Layout(context.world_size, workers, self.plan.batch_size)

    def fingerprint(self) -> dict[str, Any]:
        """The settings that fix which samples an epoch holds and their order."""
        return {
            "seed": self.plan.seed,
            "shuffle": self.plan.shuffle,
            "policy": self.plan.policy,
            "num_shards": len(self.shards),
            "num_samples": self.manifest.num_samples if self.manifest else None,
            "mixture": self.mixture.fingerprint() if self.mixture else None,
            "shuffle_buffer": self.options.shuffle_buffer,
            "num_open": self.options.num_open,
            "piece_size": self.options.piece_size,
            "block_size": self.options.block_size,
        }

    # -- sizes --------------------------------------------------------------------------------

    def samples_per_rank(self, context: Context | None = None) -> int:
        """Samples each rank yields per epoch (requires a manifest)."""
        context = context or self.context()
        return samples_per_rank(self._num_samples(), context.world_size, self.plan.policy)

    def __len__(self) -> int:
        """Batches per rank per epoch when ``batch_size`` is set, else samples per rank."""
        per_rank = self.samples_per_rank()
        return rank_batch_count(per_rank, self.plan) if self.batch_size else per_rank

    def pass_batches(self, epoch: int, history: list[PassRecord], layout: Layout) -> int:
        """Batches (samples without ``batch_size``) every rank yields in a pass."""
        self._num_samples()
        return pass_batches(self._sequence(epoch, history), layout, self.plan)

    @property
    def counted(self) -> bool:
        """Whether sample counts are known (a manifest, or a mixture of datasets with them)."""
        return self.manifest is not None or self.mixture is not None

    def _num_samples(self) -> int:
        if self.mixture is not None:
            return self.mixture.epoch_size
        if self.manifest is None:
            raise TypeError(
                "this StreamingDataset has no manifest (it reads a shard pattern or URL list), so "
                "its length is unknown; build with shardstream (or add a manifest) for len(), "
                "equal per-rank counts and exact epochs"
            )
        return self.manifest.num_samples

    def _sequence(self, epoch: int, history: list[PassRecord]) -> list[Piece]:
        """The pass's virtual sequence; a resumed one is found by replay, so it is kept."""
        key = (epoch, tuple(history))
        if key not in self._sequences:
            base = self._epoch_sequence(epoch)
            self._sequences = {key: pass_sequence(base, epoch, history, self.plan, self.stage)}
        return self._sequences[key]

    def _epoch_sequence(self, epoch: int) -> list[Piece]:
        """What a fresh pass of ``epoch`` reads, in order: whole shards, or a mixture."""
        if self.mixture is not None:
            return self.mixture.epoch_sequence(epoch, self.plan)
        counts = [spec.num_samples or 0 for spec in self.shards]
        return epoch_sequence(counts, epoch, self.plan)

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        context = self.context()
        pending, self._pending = self._pending, None
        if pending is not None:  # Stateful restore: this worker continues where it stopped
            epoch, history, plan, token = self._restored_pass(context, pending)
        else:
            epoch, directive = self.channel.take(context.worker, context.num_workers)
            history = history_from_state(directive) if directive else []
            consumed = int(directive["consumed"]) if directive else 0
            plan = self._worker_plan(context, epoch, history, consumed, True)
            token = _pass_token(epoch, directive, self.channel.pin_count, context.num_workers)
        progress = [plan.skip_samples // self.plan.batch_size]
        self._progress = {"epoch": epoch, "history": history, "progress": progress, "token": token}
        job = WorkerJob(
            stores=self.stores,
            shards=self.shards,
            pieces=plan.pieces,
            seed=plan.seed,
            stage=self.stage,
            skip_samples=plan.skip_samples,
            on_error=self.on_error,
            max_member_bytes=self.options.max_member_bytes,
            memory_map=self.options.memory_map,
            tag_streams=self.mixture is not None,
        )
        collate = functools.partial(
            batching.collate_pairs if self.options.output == "pair" else batching.collate_dicts,
            buffers=self.options.batch_buffers,
        )
        return run_worker(job, self.convert, self.batch_size, collate, progress)

    def _restored_pass(
        self, context: Context, state: dict[str, Any]
    ) -> tuple[int, list[PassRecord], WorkerPlan, int]:
        """The pass a Stateful restore continues; the next epoch if the rank had finished.

        A loader may save after the last batch without having seen the end of the epoch. The
        restored pass would then be empty; instead, when every worker of the rank had finished
        (they tell each other through the channel as they restore), it reads the next epoch.
        """
        epoch, history, items = int(state["epoch"]), history_from_state(state), int(state["items"])
        token = int(state["token"])
        plan = self._worker_plan(context, epoch, history, items, False)
        rank_done = False
        if self.counted:
            samples = sum(piece.num_samples for piece in plan.pieces)
            done = items >= -(-samples // self.plan.batch_size)
            rank_done = done
            if context.num_workers > 1:
                self.channel.report(context.worker, context.num_workers, token, done)
                if done:  # finished here: did every worker of the rank finish too?
                    reports = self.channel.wait_reports(context.num_workers, token, 60.0)
                    rank_done = reports is not None and all(reports)
        if rank_done:
            # The loader goes on asking workers in turn after the one that gave the last batch:
            # the worker it asks first plays worker 0 of the next epoch.
            layout = self.layout(context.num_workers)
            first = last_worker(self._sequence(epoch, history), layout, self.plan) + 1
            worker = (context.worker - first) % layout.num_workers
            role = dataclasses.replace(context, worker=worker)
            epoch, history = epoch + 1, []
            plan = self._worker_plan(role, epoch, history, 0, False)
            token = _pass_token(epoch, None, self.channel.pin_count, context.num_workers)
        self.channel.restored(context.worker, context.num_workers, epoch)
        return epoch, history, plan, token

    def _worker_plan(
        self, context: Context, epoch: int, history: list[PassRecord], consumed: int, rotate: bool
    ) -> WorkerPlan:
        layout = self.layout(context.num_workers)
        if not self.counted:
            if len(self.shards) < context.world_size * context.num_workers:
                logger.warning(
                    "%d shards for %d ranks x %d workers and no manifest: some workers get no "
                    "data and ranks may see different sample counts",
                    len(self.shards), context.world_size, context.num_workers,
                )  # fmt: skip
            return plan_whole_shards_worker(
                len(self.shards), epoch, history, context.rank, context.worker, layout,
                self.plan, consumed, rotate,
            )  # fmt: skip
        sequence = self._sequence(epoch, history)
        return plan_pass_worker(
            sequence, epoch, len(history), context.rank, context.worker, layout, self.plan,
            consumed, rotate,
        )  # fmt: skip

    # -- the Stateful protocol (per process: each DataLoader worker has its own) ---------------

    def state_dict(self) -> dict[str, Any]:
        """This process's position: epoch, earlier passes, items it yielded in this pass.

        Plain values only. Called by torchdata's ``StatefulDataLoader`` in each worker (in the
        training process without workers); restore it with :meth:`load_state_dict` in the same
        worker of a loader with the same world size and worker count.
        """
        context = self.context()
        layout = self.layout(context.num_workers)
        if self._progress is None:
            epoch, history, items, token = self.epoch, [], 0, 0
        else:
            epoch, history = self._progress["epoch"], self._progress["history"]
            items, token = self._progress["progress"][0], self._progress["token"]
        return {
            "version": STATE_VERSION,
            "epoch": epoch,
            "history": [record.as_dict() for record in history],
            "items": items,
            "token": token,
            "worker": context.worker,
            **layout.as_dict(),
            "fingerprint": self.fingerprint(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next pass continue from :meth:`state_dict`.

        Raises:
            ConfigError: The state is of another version, or the seed, dataset, policy, reading
                settings, world size, worker count or batch size differ (names the field).
        """
        check_version(state)
        check_fingerprint(state["fingerprint"], self.fingerprint())
        context = self.context()
        check_layout(
            layout_from_state(state),
            self.layout(context.num_workers),
            elastic=False,
            allow_new_batch_size=False,
        )
        self._pending = dict(state)
        # Should this pass be thrown away (a loader that finished its epoch starts afresh),
        # the next fresh pass of this worker still moves on to the following epoch.
        self.channel.restored(context.worker, context.num_workers, int(state["epoch"]))


def _pass_token(
    epoch: int, directive: dict[str, Any] | None, pin_count: int, num_workers: int
) -> int:
    """An id of a pass that all workers of a rank agree on (to recognise a restore together)."""
    text = json.dumps([epoch, directive, pin_count, num_workers], sort_keys=True)
    return zlib.crc32(text.encode("utf-8")) + 1


def _only_streams(items: Sequence[Any]) -> list[Stream]:
    if not all(isinstance(item, Stream) for item in items):
        raise ConfigError("a mixture takes Stream(...) items only; wrap every source in a Stream")
    return list(items)
