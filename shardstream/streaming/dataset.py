"""StreamingDataset: wires the shard list, the pass plan, the worker pipeline and decoding."""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import torch.utils.data

from shardstream.catalog.shardlist import ShardList, Source, resolve_source
from shardstream.errors import ConfigError
from shardstream.format.manifest import Manifest
from shardstream.streaming.context import Context, current_context
from shardstream.streaming.decoding.decode import SampleConverter
from shardstream.streaming.epochs import PassCache, WorkerPass, start_pass
from shardstream.streaming.mixture import Mixture, Stream
from shardstream.streaming.options import StreamOptions
from shardstream.streaming.planning.schedule import PassPlan, plan_ranks
from shardstream.streaming.planning.split import Layout, samples_per_rank
from shardstream.streaming.planning.wholeshardplan import plan_whole_shards
from shardstream.streaming.resumestate import (
    STATE_VERSION,
    PassState,
    check_fingerprint,
    check_layout,
    check_version,
    layout_from_dict,
)
from shardstream.streaming.settings import Settings
from shardstream.streaming.versions import DatasetVersion, VersionNumber, VersionSet, reopen
from shardstream.streaming.worker import batch as batching
from shardstream.streaming.worker.channel import EpochChannel
from shardstream.streaming.worker.pipeline import Batcher, StepJob, run_steps
from shardstream.streaming.worker.reader import ShardReader
from shardstream.streaming.worker.stageclock import StageClock, StatsBoard
from shardstream.streaming.worker.wholeshardpass import run_whole_shards

__all__ = ["StreamOptions", "StreamingDataset"]

logger = logging.getLogger("shardstream.streaming")


class StreamingDataset(torch.utils.data.IterableDataset):
    """Stream WebDataset shards into PyTorch with exact, equal and resumable epochs.

    With a manifest (a folder written by :func:`shardstream.build_shards` or indexed by
    ``shardstream index``), every rank yields the same number of samples and batches per epoch,
    ``len()`` says how many (batches when ``batch_size`` is set, else samples, per rank), and a
    :class:`StreamingDataLoader` can resume mid-epoch, also at another world size. Without one
    (a brace pattern or a URL list), counts are unknown: there is no ``len()``, ranks may get
    different counts, and whole shards are dealt to ranks and workers.

    Args:
        source: Dataset folder/URL with ``manifest.json``, a brace pattern of shard URLs, a
            list of shard URLs, or a list of :class:`Stream` (a mixture, see
            :mod:`shardstream.streaming.mixture`).
        shuffle: Shuffle shard order and interleave pieces per epoch (seeded; see
            ``set_epoch``).
        seed: Seed of every random choice; identical on every rank.
        decode: ``"raw"`` bytes, ``"pil"``, ``"rgb8"`` (uint8 CHW tensor) or ``f(bytes, ext)``.
        transform: Applied to each decoded image (torchvision v2 transforms work). A v2
            ``Compose`` starting with ``RandomResizedCrop`` takes a faster path that draws the
            crop first and decodes JPEGs at the lowest resolution that keeps it (see
            :mod:`shardstream.streaming.decoding.fastcrop`); ``Resize`` first decodes at
            reduced scale.
        batch_size: Collate this many samples inside the workers (use ``DataLoader(...,
            batch_size=None)``); None yields single samples.
        policy: ``"pad"`` (every sample at least once, < world_size repeated) or ``"drop"``
            (every sample at most once, < world_size left out).
        on_error: ``"raise"`` (default) or ``"skip"`` corrupt samples and truncated shards,
            logging and counting them.
        options: Less common settings, see :class:`StreamOptions`.
        epoch_size: Samples per epoch over all ranks, for a mixture with proportions.
        version: Pin this version of a dataset that grows (``build_shards(..., append=True)``);
            None reads the newest published when the dataset is made. A resumed epoch reads
            the version it began with either way (see :mod:`shardstream.streaming.versions`).

    Epochs: each new pass over the dataset moves to the next epoch by itself (new shard order
    and shuffles), whatever loader runs it and whether its workers persist; ``set_epoch(n)``
    pins the epoch instead, and reaches persistent workers too. The dataset follows the
    ``Stateful`` protocol (``state_dict``/``load_state_dict`` per worker), so torchdata's
    ``StatefulDataLoader`` resumes it mid-epoch exactly.

    Versions: a dataset that grows is read at one version per epoch (``self.version``: the
    newest when the dataset was made, or ``version=N``); a resumed epoch reads the version its
    state records, the next epoch ``self.version`` (see :mod:`shardstream.streaming.versions`).

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
        version: int | None = None,
    ) -> None:
        self.settings = Settings(
            seed, shuffle, policy, batch_size, on_error, epoch_size, options or StreamOptions()
        )
        self.mixture: Mixture | None = None
        self._streams: list[Stream] = []  # a mixture's, to open it at other versions
        self.manifest: Manifest | None = None
        self.shards = self._resolve(source, version)
        self.settings = self.settings.with_facts(self.shards.facts())
        self.convert = SampleConverter(
            decode, transform, self.options.output, self.options.allow_pickle,
            batch_size is not None,
        )  # fmt: skip
        self.channel = EpochChannel()
        self.stats_board = StatsBoard() if self.options.stats else None
        self.passes = PassCache(self.shards, self.mixture, self.settings.plan)
        self.version: VersionNumber = self.manifest.version if self.manifest else None
        if self.mixture is not None:
            self.version = self.mixture.versions
        opened = DatasetVersion(
            self.version, self.shards, self.manifest, self.passes, self.settings, self.mixture
        )
        self.versions = VersionSet(source, opened, self._open_version)
        self._pending: dict[str, Any] | None = None  # a Stateful restore, for the next pass
        self._running: WorkerPass | None = None  # the pass under way in this process
        # DataLoader workers do not see torch.distributed: read rank and world size here, in the
        # training process (again in set_epoch), and hand them to the workers with the dataset.
        self._ranks = self._read_ranks()

    def _open_version(self, number: Any) -> DatasetVersion:
        """Another version of this dataset (a resumed epoch may read an older one)."""
        return reopen(self.versions.source, self._streams, number, self.settings)

    def _resolve(
        self, source: Source | Stream | Sequence[Stream], version: int | None
    ) -> ShardList:
        options = self.options
        streams = [source] if isinstance(source, Stream) else source
        if isinstance(streams, (list, tuple)) and any(isinstance(s, Stream) for s in streams):
            if not all(isinstance(item, Stream) for item in streams):
                raise ConfigError("a mixture takes Stream(...) items only; wrap every source")
            if version is not None:
                raise ConfigError("a mixture pins versions per stream: Stream(..., version=N)")
            self._streams = [cast(Stream, stream) for stream in streams]
            self.mixture = Mixture(
                streams, self.settings.epoch_size, self.settings.seed, options.storage_options,
                options.read_options,
            )  # fmt: skip
            return self.mixture.shards
        if self.settings.epoch_size is not None:
            raise ConfigError("epoch_size is for mixtures of Stream(...) sources")
        _, shards, self.manifest = resolve_source(
            cast(Source, source), options.storage_options, options.read_options, version
        )
        return shards

    @property
    def options(self) -> StreamOptions:
        """The dataset's :class:`StreamOptions`."""
        return self.settings.options

    @property
    def batch_size(self) -> int | None:
        """Samples per batch made in the workers, or None."""
        return self.settings.batch_size

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
        """This rank's layout: world size, workers (default: the current ones), batch size."""
        context = self.context()
        workers = context.num_workers if num_workers is None else max(1, num_workers)
        return Layout(context.world_size, workers, self.settings.micro_batch)

    def fingerprint(self, version: VersionNumber = None) -> dict[str, Any]:
        """The settings and dataset facts that fix which samples an epoch holds, in order.

        ``version``: of that version of the dataset (None: the opened one).
        """
        opened = self.versions.get(version)
        return {
            **opened.settings.fingerprint(),
            "num_shards": len(opened.shards),
            "num_samples": opened.manifest.num_samples if opened.manifest else None,
            "mixture": opened.mixture.fingerprint() if opened.mixture else None,
            "canonical": [self.options.canonical_ranks, self.options.canonical_workers],
        }

    # -- sizes --------------------------------------------------------------------------------

    @property
    def counted(self) -> bool:
        """Whether sample counts are known (a manifest, or a mixture of datasets with them)."""
        return self.shards.counted

    def _epoch_samples(self) -> int:
        if not self.counted:
            raise TypeError(
                "this StreamingDataset has no manifest (it reads a shard pattern or URL list), "
                "so its length is unknown; run `shardstream index` on the shards (or build them "
                "with shardstream) for len(), equal per-rank counts and exact epochs"
            )
        return self.mixture.epoch_size if self.mixture else self.passes.epoch_length()

    def samples_per_rank(self, context: Context | None = None) -> int:
        """Samples each rank yields per epoch (requires a manifest)."""
        context = context or self.context()
        return samples_per_rank(self._epoch_samples(), context.world_size, self.settings.policy)

    def __len__(self) -> int:
        """Batches per rank per epoch when ``batch_size`` is set, else samples per rank."""
        physical = self.layout()
        layout = self.settings.plan_layout(physical)
        steps = self.passes.shape(self._epoch_samples(), layout).steps
        return steps

    def plan(self, state: PassState, physical: Layout) -> PassPlan:
        """The pass ``state`` describes (its plan layout, or a fresh one for ``physical``)."""
        layout = state.plan or self.settings.plan_layout(physical)
        passes = self.versions.get(state.dataset_version).passes
        return passes.plan(state.epoch, state.history, layout)

    # -- iteration ----------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        context = self.context()
        pending, self._pending = self._pending, None
        running = start_pass(self, context, pending)
        self._running = running
        stats = running.stats
        shards = self.versions.get(running.state.dataset_version).shards
        reader = ShardReader(shards, self.settings.read(self.mixture is not None), stats)
        collate = functools.partial(
            batching.collate_pairs if self.options.output == "pair" else batching.collate_dicts,
            buffers=self.options.batch_buffers,
        )
        clock = None
        if self.stats_board is not None:
            in_worker = torch.utils.data.get_worker_info() is not None
            clock = StageClock(self.stats_board.row(context.worker if in_worker else None))
        self.convert.clock = clock
        batcher = Batcher(self.convert, self.batch_size, collate, self.settings.on_error, clock)
        if running.plan is None:  # no manifest: whole shards
            whole = plan_whole_shards(
                len(shards), self.settings.seed, self.settings.shuffle, running.state.epoch,
                context.rank, context.world_size, context.worker, context.num_workers,
                running.start,
            )  # fmt: skip
            return run_whole_shards(
                whole, reader, batcher, stats, self.settings.open_shards,
                self.options.shuffle_buffer, self.settings.shuffle,
            )  # fmt: skip
        ranks = plan_ranks(running.plan.layout.world_size, context.world_size, context.rank)
        first = running.start + running.role + stats.batches * context.num_workers
        job = StepJob(running.plan, ranks, first, context.num_workers)
        return run_steps(job, reader, batcher, stats)

    # -- the Stateful protocol (per process: each DataLoader worker has its own) ---------------

    def state_dict(self) -> dict[str, Any]:
        """This process's position: epoch, earlier passes, steps it served in this pass.

        Plain values only. Called by torchdata's ``StatefulDataLoader`` in each worker (in the
        training process without workers); restore it with :meth:`load_state_dict` in the same
        worker of a loader with the same world size and worker count.
        """
        context = self.context()
        running = self._running
        state = PassState(self.epoch) if running is None else running.state
        return {
            "version": STATE_VERSION,
            **state.as_dict(),
            "start": running.start if running else 0,
            "role": running.role if running else context.worker,
            "served": running.stats.batches if running else 0,
            "token": running.token if running else 0,
            "worker": context.worker,
            **self.layout(context.num_workers).as_dict(),
            "fingerprint": self.fingerprint(state.dataset_version),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next pass continue from :meth:`state_dict`.

        Raises:
            ConfigError: The state is of another version, or the seed, dataset, policy, reading
                settings, world size, worker count or batch size differ (names the field).
        """
        check_version(state)
        number = self.versions.number_for(state)
        check_fingerprint(state["fingerprint"], self.fingerprint(number))
        context = self.context()
        check_layout(
            layout_from_dict(state), self.layout(context.num_workers), elastic=False,
            allow_new_batch_size=False,
        )  # fmt: skip
        self._pending = {**state, "dataset_version": number}
        # Should this pass be thrown away (a loader that finished its epoch starts afresh),
        # the next fresh pass of this worker still moves on to the following epoch.
        self.channel.restored(context.worker, context.num_workers, int(state["epoch"]))
