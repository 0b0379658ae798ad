"""StreamingDataset: wires the shard list, pass control, the worker pipeline and decoding."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch.utils.data

from shardstream._catalog.shardlist import ShardList, Source
from shardstream._format.manifest import Manifest
from shardstream.errors import ConfigError
from shardstream.streaming._control.context import MAX_WORKERS, Context, EpochChannel
from shardstream.streaming._control.controller import PassControl
from shardstream.streaming._control.resumestate import PassState, VersionNumber
from shardstream.streaming._control.versionset import VersionSet, open_version
from shardstream.streaming._control.workerpass import PassInputs, run_pass
from shardstream.streaming._decoding.decode import SampleConverter
from shardstream.streaming._decoding.gpudecode import GpuDecode, resolve_gpu_decode
from shardstream.streaming._options import (
    DecodeMode,
    Mixture,
    OnError,
    Policy,
    Settings,
    Stream,
    StreamOptions,
    with_storage_options,
)
from shardstream.streaming._planning.split import Layout, PassPlan
from shardstream.streaming._worker.pipeline import StatsBoard

__all__ = ["StreamOptions", "StreamingDataset"]


class StreamingDataset(torch.utils.data.IterableDataset):
    """Stream WebDataset shards into PyTorch with exact, equal and resumable epochs.

    With a manifest (a folder written by :func:`~shardstream.build_shards` or indexed by
    ``shardstream index``), every rank yields the same number of samples and batches per epoch,
    ``len()`` says how many (batches when ``batch_size`` is set, else samples, per rank), and a
    :class:`StreamingDataLoader` can resume mid-epoch, also at another world size. Without one
    (a brace pattern or a URL list), counts are unknown: there is no ``len()``, ranks may get
    different counts, and whole shards are dealt to ranks and workers.

    Args:
        source: Dataset folder/URL with ``manifest.json``, a brace pattern of shard URLs, a
            list of shard URLs, or a list of :class:`Stream` (a mixture).
        shuffle: Shuffle shard order and interleave pieces per epoch (seeded; see
            ``set_epoch``).
        seed: Seed of every random choice; identical on every rank.
        decode: ``"raw"`` bytes, ``"pil"``, ``"rgb8"`` (uint8 CHW tensor), ``f(bytes, ext)``,
            or ``"cuda"`` / a :class:`~shardstream.GpuDecode`:
            workers draw the crops and hand over encoded images, and the training process
            decodes and transforms them on the GPU (``StreamingDataLoader`` does it by itself;
            with another loader call ``ds.gpu_decode(batch)``). Without CUDA, ``"cuda"``
            decodes on the CPU in the workers, with the same transform and draws.
        transform: Applied to each decoded image (torchvision v2 transforms work). A v2
            ``Compose`` starting with ``RandomResizedCrop`` takes a faster path that draws the
            crop first and decodes JPEGs at the lowest resolution that keeps it; ``Resize``
            first decodes at reduced scale.
        batch_size: Collate this many samples inside the workers (use ``DataLoader(...,
            batch_size=None)``); None yields single samples.
        policy: ``"pad"`` (every sample at least once, < world_size repeated), ``"drop"``
            (every sample at most once, < world_size left out) or ``"mask"`` for evaluation:
            every sample exactly once over all ranks, every rank the same number of batches,
            and the filler entries that even them out (real samples read again) marked False
            in a bool ``valid`` tensor: ``(images, labels, valid)``, or the ``__valid__`` field
            of dict batches and samples. Needs sample counts (a manifest).
        on_error: ``"raise"`` (default) or ``"skip"`` corrupt samples and truncated shards,
            logging and counting them.
        options: Less common settings, see :class:`StreamOptions`.
        epoch_size: Samples per epoch over all ranks, for a mixture with proportions.
        version: Pin this version of a dataset that grows (``build_shards(..., append=True)``);
            None reads the newest published when the dataset is made. A resumed epoch reads
            the version it began with either way.
        storage_options: Credentials and settings of a remote store (as for
            :func:`~shardstream.build_shards`); the same as ``StreamOptions(storage_options=...)``.

    Epochs: each new pass over the dataset moves to the next epoch by itself (new shard order
    and shuffles), whatever loader runs it and whether its workers persist; ``set_epoch(n)``
    pins the epoch instead, and reaches persistent workers too. The dataset follows the
    ``Stateful`` protocol (``state_dict``/``load_state_dict`` per worker), so torchdata's
    ``StatefulDataLoader`` resumes it mid-epoch exactly.

    Versions: a dataset that grows is read at one version per epoch (``self.version``: the
    newest when the dataset was made, or ``version=N``); a resumed epoch reads the version its
    state records, the next epoch ``self.version``. Under torch.distributed every rank reads
    the version the job's first rank to make the dataset opened (posted to the process group's
    store; making a dataset is not a collective, so rank 0 may make one alone), and
    ``refresh_version`` or ``StreamOptions(follow_versions=True)`` move every rank to the
    newest between epochs.

    Examples:
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
        decode: DecodeMode | str | GpuDecode | Callable[[bytes, str], Any] = "rgb8",
        transform: Callable[[Any], Any] | None = None,
        batch_size: int | None = None,
        policy: Policy = "pad",
        on_error: OnError = "raise",
        options: StreamOptions | None = None,
        epoch_size: int | None = None,
        version: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        options = with_storage_options(options, storage_options)
        settings = Settings(seed, shuffle, policy, batch_size, on_error, epoch_size, options)
        opened = open_version(source, settings, version)
        if policy == "mask" and not opened.shards.counted:
            raise ConfigError(
                f"policy='mask' needs every shard's sample count to mark the fillers, and "
                f"{source!r} has no manifest; run `shardstream index` on the shards first"
            )
        worker_decode, gpu_decode = resolve_gpu_decode(decode, transform, on_error)
        #: Decodes and transforms one raw sample (in the workers).
        self.convert = SampleConverter(
            worker_decode, transform, options.output, options.allow_pickle, batch_size is not None
        )
        #: Finishes batches on the GPU in the training process (``decode="cuda"``), else None.
        self.gpu_decode: GpuDecode | None = gpu_decode
        #: Loader statistics' shared table, or None (``StreamOptions(stats=True)``).
        self.stats_board = StatsBoard(MAX_WORKERS) if options.stats else None
        #: Which pass each process reads, and its resume (:mod:`.control`).
        versions = VersionSet(source, opened, pinned=version is not None)
        self.control = PassControl(PassInputs(versions, EpochChannel(opened.number)))

    def __iter__(self) -> Iterator[Any]:
        return run_pass(self.control.next_job(self.convert, self.stats_board))

    def __repr__(self) -> str:
        settings = self.settings
        where = ", ".join(repr(source.shards.shown()) for source in self.shards.sources)
        samples = f"{self.shards.total_samples()} samples" if self.counted else "uncounted"
        version = "" if self.version is None else f", version={self.version}"
        return (
            f"StreamingDataset({where}, {samples} in {len(self.shards)} shards{version}, "
            f"shuffle={settings.shuffle}, seed={settings.seed}, "
            f"batch_size={settings.batch_size}, policy={settings.policy!r}, "
            f"decode={self.convert.decode!r}, epoch={self.epoch})"
        )

    def __len__(self) -> int:
        """Batches per rank per epoch when ``batch_size`` is set, else samples per rank."""
        return self.control.epoch_steps()

    def __getitem__(self, index: Any) -> Any:
        """Refused with a pointer: a stream has no ``ds[i]`` (torch's message names none)."""
        raise TypeError(
            f"StreamingDataset streams samples in epochs and has no ds[{index!r}]; iterate it "
            "(or a StreamingDataLoader over it), or open the same source with "
            "RandomAccessDataset(source) for ds[i] and ds.by_key(key)"
        )

    # -- what was opened ----------------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings, with the facts of the version fresh epochs read."""
        return self.versions.opened.settings

    @property
    def shards(self) -> ShardList:
        """The shards of the version fresh epochs read."""
        return self.versions.opened.shards

    @property
    def options(self) -> StreamOptions:
        """The dataset's :class:`StreamOptions`."""
        return self.settings.options

    @property
    def batch_size(self) -> int | None:
        """Samples per batch made in the workers, or None."""
        return self.settings.batch_size

    @property
    def versions(self) -> VersionSet:
        """The opened version of the dataset, and older ones resumed epochs read."""
        return self.control.inputs.versions

    @property
    def version(self) -> VersionNumber:
        """The version fresh epochs read (a mixture's: its streams'; None without versions)."""
        return self.versions.opened.number

    @property
    def manifest(self) -> Manifest | None:
        """The opened version's manifest (None for a mixture or without one)."""
        return self.versions.opened.manifest

    @property
    def mixture(self) -> Mixture | None:
        """The mixture, if the source is a list of :class:`Stream`."""
        return self.versions.opened.mixture

    @property
    def counted(self) -> bool:
        """Whether sample counts are known (a manifest, or a mixture of datasets with them)."""
        return self.shards.counted

    # -- epochs, ranks and plans (see :class:`~.control.controller.PassControl`) --------------

    @property
    def epoch(self) -> int:
        """The epoch pinned by :meth:`set_epoch` (0 before any call)."""
        return self.control.epoch

    def set_epoch(self, epoch: int) -> None:
        """Read ``epoch`` in the next pass (shard order and shuffles); later passes count on.

        Optional: passes advance by themselves. Reaches persistent DataLoader workers too.
        With ``StreamOptions(follow_versions=True)`` it also moves to the newest version (see
        :meth:`refresh_version`): call it on every rank.
        """
        self.control.pin(int(epoch))

    def refresh_version(self) -> VersionNumber:
        """Read the newest published version from the next fresh epoch on; return it.

        Under torch.distributed every rank moves to the version the first rank to refresh
        found (posted to the process group's store: no rank waits for another; call it the
        same number of times on every rank that has the dataset, in the training process). An
        epoch under way, and a resumed one, finish on the version they began with.
        ``StreamOptions(follow_versions=True)`` calls it at each epoch's start.

        Raises:
            ConfigError: The dataset was made with ``version=N``, or with ranks given
                explicitly, or this rank cannot read the version the job moves to (names it).

        Examples:
            >>> ds.refresh_version()  # doctest: +SKIP
            3
        """
        return self.control.refresh()

    def context(self) -> Context:
        """Rank, world size (as seen by the training process) and the current worker."""
        return self.control.context()

    def layout(self, num_workers: int | None = None) -> Layout:
        """This rank's layout: world size, workers (default: the current ones), batch size."""
        return self.control.layout(num_workers)

    def plan(self, state: PassState, physical: Layout) -> PassPlan:
        """The pass ``state`` describes (its plan layout, or a fresh one for ``physical``)."""
        return self.control.inputs.plan(state, physical)

    def fingerprint(self, version: VersionNumber = None) -> dict[str, Any]:
        """The settings and dataset facts that fix which samples an epoch holds, in order.

        ``version``: of that version of the dataset (None: the opened one).
        """
        return self.control.inputs.fingerprint(version)

    def samples_per_rank(self, context: Context | None = None) -> int:
        """Samples each rank yields per epoch (requires a manifest)."""
        return self.control.samples_per_rank(context)

    # -- the Stateful protocol (per process: each DataLoader worker has its own) ---------------

    def state_dict(self) -> dict[str, Any]:
        """This process's position: epoch, earlier passes, steps it served in this pass.

        Plain values only. Called by torchdata's ``StatefulDataLoader`` in each worker (in the
        training process without workers); restore it with :meth:`load_state_dict` in the same
        worker of a loader with the same world size and worker count.
        """
        return self.control.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make this process's next pass continue from :meth:`state_dict`.

        Raises:
            ConfigError: The state is of another version, or the seed, dataset, policy, reading
                settings, world size, worker count or batch size differ (names the field).
        """
        self.control.load_state_dict(state)
