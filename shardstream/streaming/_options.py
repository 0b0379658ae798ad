"""StreamOptions: the less common settings of a StreamingDataset, in one frozen dataclass.

Mixtures: several datasets read as one, in exact per-epoch proportions.

:class:`Stream` names one dataset of a mixture and its share; :class:`Mixture` resolves the
streams to stores and shard tables. How an epoch takes each stream's quota, and how the
streams' runs are merged into one sequence, is planning
(:mod:`shardstream.streaming._planning.mixing`).

Every setting of a StreamingDataset, validated once, and what the layers below need of them."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from shardstream._catalog.shardlist import ShardList, Source, resolve_source, source_of
from shardstream._format.tarreader import DEFAULT_MAX_MEMBER_BYTES
from shardstream._storage import ReadOptions, StorageOptions
from shardstream._storage.messages import redacted_repr
from shardstream._storage.options import file_budget
from shardstream.errors import ConfigError
from shardstream.streaming._planning.mixing import MixedStream, MixtureSequence, stream_quotas
from shardstream.streaming._planning.order import (
    DatasetFacts,
    OrderChoice,
    PlanOptions,
    choose_open_shards,
    choose_order,
)
from shardstream.streaming._planning.split import Layout
from shardstream.streaming._worker.reader import ReadSettings

__all__ = [
    "DecodeMode",
    "Interleave",
    "Mixture",
    "OnError",
    "Output",
    "Policy",
    "Settings",
    "Stream",
    "StreamOptions",
    "stream_quotas",
    "with_storage_options",
]


#: What ``decode=`` names: encoded bytes, a PIL image, a uint8 CHW tensor, or the GPU's decode
#: (``"cuda:N"`` for device N); a callable ``f(bytes, extension)`` is taken too.
DecodeMode = Literal["raw", "pil", "rgb8", "cuda"]
#: How epochs are evened across ranks (see ``StreamingDataset``).
Policy = Literal["pad", "drop", "mask"]
#: What a corrupt sample or truncated shard does.
OnError = Literal["raise", "skip"]
#: What a sample is: ``(image, label)`` or a dict of every field.
Output = Literal["pair", "dict"]
#: How a window's pieces take turns (see ``StreamOptions.interleave``).
Interleave = Literal["stratified", "uniform"]


@dataclasses.dataclass(frozen=True)
class StreamOptions:
    """Less common settings of :class:`~shardstream.StreamingDataset`.

    Attributes:
        num_open: Lanes a worker stream reads from at once: each worker stream is read in
            windows of about ``num_open * piece_size`` samples whose pieces, from all over the
            rank's share of the epoch, come in a seeded random interleave. A batch holds
            samples from about ``min(batch, num_open)`` places, so keep it well above the batch
            size. None chooses from the dataset: 512 for local indexed shards.
        piece_size: Longest run of consecutive samples read from one place of a shard (one
            read or memory map). Larger means fewer, larger reads (remote: ranged requests).
            None chooses from the dataset: 8 locally, at least 1 MiB of samples remotely.
        chunk_size: The epoch is read in chunks of this many consecutive samples, each from a
            seeded random place of the dataset, so shards written in class order
            still give every rank and worker the whole dataset's mix all epoch long. 0 reads
            whole shards in a shuffled order (the earlier whole-shard order). None chooses
            from the dataset: a piece for indexed shards, 0 without indexes.
        block_size: Samples dealt to a worker stream at a time (rounded up to the batch size).
            None chooses from the dataset: 64, or four pieces remotely.
        interleave: How a window's pieces take turns. ``"stratified"`` (the default) spreads
            each piece evenly over its window at a random phase, so every stretch of
            ``num_open`` samples holds about one sample of each piece, in a random order: a
            batch holds samples of about ``min(batch, num_open)`` places. ``"uniform"`` interleaves
            them uniformly at random, the order of shardstream 0.2 and earlier (a batch of 64
            from 73 pieces then holds about 42 of them); pass it to continue an epoch from a
            state those versions saved.
        shuffle_buffer: Samples held by the shuffle buffer, for shards without a manifest
            (counted datasets are ordered by their windows and need no buffer).
        canonical_ranks: Plan every epoch for this many ranks, whatever the world size: then
            every world size that divides it sees the same global batches (keep
            ``batch_size * world_size`` fixed), so results reproduce on another cluster and a
            restart at such a size continues without a replay. None plans for the world size.
        canonical_workers: With ``canonical_ranks``, the worker streams per planned rank
            (default 8); DataLoader worker counts that divide it read most efficiently.
        rank: This process's rank; with ``world_size`` overrides ``torch.distributed``.
        world_size: Number of ranks.
        output: ``"pair"`` yields ``(image, label)``; ``"dict"`` yields every field.
        allow_pickle: Unpickle ``.pyd``/``.pth`` members (runs code from the data; opt in only
            for data you trust).
        max_member_bytes: Largest tar member read into memory (1 GiB). A header declaring more,
            or more than the rest of the shard, is a ``ShardFormatError`` (skipped and counted
            with ``on_error="skip"``), so a corrupt or hostile shard cannot exhaust memory.
        memory_map: Read local shards that have an index through copy-on-write memory maps
            (no copy and no private memory per buffered sample): each shard is mapped whole on its
            first piece and kept for the pass (at most 2 GiB of shard files per reader), so the
            pages read count in the process's resident size until the pass ends; replace
            mapped shards by renaming, never in place (README, *Streaming*). False reads with
            ``readinto``.
        batch_buffers: Shared-memory batch buffers each DataLoader worker keeps and reuses once
            the training process has freed a batch (Linux). 0 allocates a new segment per
            batch, as PyTorch does; more helps only when batches are held longer.
        storage_options: fsspec options for remote URLs (a mixture's streams inherit them).
        read_options: Retries, read-ahead and cache for remote reads.
        stats: Count where the loader's time goes (storage, decode, transform, collate per
            worker; the training loop's waits): ``StreamingDataLoader.stats()``. Off by default.
        stats_interval_s: With ``stats``, log a summary line on ``shardstream.stats`` this
            often (from ``StreamingDataLoader``); None logs nothing.
        follow_versions: Move to the newest published version of a dataset that grows at each
            epoch's start, every rank together (the first rank to start the epoch looks, the
            others follow): when a ``StreamingDataLoader`` starts an epoch, and at
            ``set_epoch``. An epoch under way, and a resumed one, keep the version they began
            with. Off: the dataset reads the version it opened until it is made again (or
            ``refresh_version`` is called).

    Examples:
        >>> StreamOptions(num_open=32).num_open
        32
    """

    num_open: int | None = None
    piece_size: int | None = None
    chunk_size: int | None = None
    block_size: int | None = None
    interleave: Interleave = "stratified"
    shuffle_buffer: int = 1000
    canonical_ranks: int | None = None
    canonical_workers: int | None = None
    rank: int | None = None
    world_size: int | None = None
    output: Output = "pair"
    allow_pickle: bool = False
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    memory_map: bool = True
    batch_buffers: int = 6
    storage_options: Mapping[str, Any] | None = None
    read_options: ReadOptions | None = None
    stats: bool = False
    stats_interval_s: float | None = None
    follow_versions: bool = False

    __repr__ = redacted_repr


def with_storage_options(
    options: StreamOptions | None, storage_options: Mapping[str, Any] | None
) -> StreamOptions:
    """``options`` with ``storage_options`` given as a plain keyword argument folded in.

    Raises:
        ConfigError: Both name storage options, and they differ.
    """
    options = options or StreamOptions()
    if storage_options is None:
        return options
    if options.storage_options is not None and dict(options.storage_options) != dict(
        storage_options
    ):
        raise ConfigError(
            "storage_options was given twice, as an argument and in StreamOptions, with "
            "different values: pass it once"
        )
    return dataclasses.replace(options, storage_options=dict(storage_options))


@dataclasses.dataclass(frozen=True)
class Stream:
    """One dataset of a mixture.

    Attributes:
        source: Anything :class:`~shardstream.StreamingDataset` reads, with a
            manifest (a dataset folder or URL): the counts make the proportions exact.
        proportion: Share of each epoch (of ``epoch_size``); relative, need not sum to 1.
        repeat: Samples per epoch as a multiple of the stream's size (0.5: half, 2.0: twice);
            used when no stream has a ``proportion``; 1.0 when neither is given.
        name: Shown in summaries; defaults to the source.
        storage_options: fsspec options for this stream's URLs.
        read_options: Retries, read-ahead and cache for this stream.
        version: Pin this version of a dataset that grows (None: the newest when the mixture
            is made).

    Examples:
        >>> Stream("s3://bucket/web", proportion=0.7).proportion
        0.7
    """

    source: Source
    proportion: float | None = None
    repeat: float | None = None
    name: str | None = None
    storage_options: Mapping[str, Any] | None = None
    read_options: ReadOptions | None = None
    version: int | None = None

    __repr__ = redacted_repr


class Mixture:
    """Streams resolved to stores and shard tables, with their per-epoch quotas.

    Args:
        streams: The streams, each with a manifest.
        epoch_size: Samples per epoch over all ranks (required with proportions).
        seed: The dataset's seed.
        storage_options: fsspec options for streams that give none of their own.
        read_options: Read options for streams that give none of their own.
    """

    def __init__(
        self,
        streams: Sequence[Stream],
        epoch_size: int | None,
        seed: int,
        storage_options: StorageOptions = None,
        read_options: ReadOptions | None = None,
    ) -> None:
        if not streams:
            raise ConfigError("a mixture needs at least one Stream")
        sources, self.names, versions = [], [], []
        for index, stream in enumerate(streams):
            store, _, manifest = resolve_source(
                stream.source,
                stream.storage_options if stream.storage_options is not None else storage_options,
                stream.read_options if stream.read_options is not None else read_options,
                stream.version,
            )
            if manifest is None:
                raise ConfigError(
                    f"stream {index} ({stream.source!r}) has no manifest; a mixture needs every "
                    "stream's sample counts to keep its proportions exact (run `shardstream "
                    "index` on shards made by other tools)"
                )
            sources.append(source_of(store, manifest))
            self.names.append(stream.name or store.shown())
            versions.append(manifest.version)
        #: The version of every stream's dataset read (see
        #: :mod:`shardstream.streaming._control.versionset`).
        self.versions = tuple(versions)
        self.shards = ShardList(sources)
        sizes = [int(self.shards.counts(i).sum()) for i in range(len(streams))]
        self.quotas = stream_quotas(
            sizes,
            [stream.proportion for stream in streams],
            [stream.repeat for stream in streams],
            epoch_size,
        )
        self.streams = [
            MixedStream(
                int(self.shards.firsts[i]),
                self.shards.counts(i),
                quota,
                int(np.random.SeedSequence([seed, i, 0x6D1C]).generate_state(1)[0]),
            )
            for i, quota in enumerate(self.quotas)
        ]
        self.epoch_size = sum(self.quotas)
        if self.epoch_size == 0:
            raise ConfigError("the mixture takes no samples per epoch")

    def summary(self) -> list[dict[str, Any]]:
        """Per stream: name, samples, samples per epoch and share of the epoch."""
        return [
            {
                "name": name,
                "num_samples": int(stream.counts.sum()),
                "samples_per_epoch": stream.quota,
                "share": stream.quota / self.epoch_size,
            }
            for name, stream in zip(self.names, self.streams, strict=True)
        ]

    def fingerprint(self) -> list[list[Any]]:
        """What fixes the mixture's samples: per stream its size and quota."""
        return [[int(stream.counts.sum()), stream.quota] for stream in self.streams]

    def epoch_sequence(self, epoch: int, options: PlanOptions) -> MixtureSequence:
        """Every stream's window of ``epoch``, merged in exact proportion."""
        return MixtureSequence(self.streams, epoch, options)


_DEFAULT_CANONICAL_WORKERS = 8
#: The order's numbers, each a ``StreamOptions`` field of the same name (None: chosen).
_ORDER_FIELDS = tuple(field.name for field in dataclasses.fields(OrderChoice))
#: Before the shards are known: no index, so whole shards (only for validating options).
_UNKNOWN = DatasetFacts(indexed=False, local=True, mean_sample_bytes=0.0)


@dataclasses.dataclass(frozen=True)
class Settings:
    """The dataset's settings: the constructor's arguments and its :class:`StreamOptions`.

    ``facts`` (from the manifest, see :meth:`with_facts`) decide the order's numbers that the
    options leave to shardstream (:mod:`~shardstream.streaming._planning.order`).

    Raises:
        ConfigError: Any value out of range, naming the setting and what it accepts.
    """

    seed: int
    shuffle: bool
    policy: str
    batch_size: int | None
    on_error: str
    epoch_size: int | None
    options: StreamOptions
    facts: DatasetFacts = _UNKNOWN

    def __post_init__(self) -> None:
        options = self.options
        if self.on_error not in ("raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1 or None, got {self.batch_size}")
        if options.output not in ("pair", "dict"):
            raise ConfigError(f"output must be 'pair' or 'dict', got {options.output!r}")
        _check_range("batch_buffers", options.batch_buffers, 0, 64)
        _check_range("shuffle_buffer", options.shuffle_buffer, 0, None)
        _check_range("max_member_bytes", options.max_member_bytes, 1, None)
        for name in _ORDER_FIELDS:
            if getattr(options, name) is not None:
                _check_range(name, getattr(options, name), 0 if name == "chunk_size" else 1, None)
        if options.canonical_workers is not None and options.canonical_ranks is None:
            raise ConfigError("canonical_workers needs canonical_ranks")
        if options.canonical_ranks is not None:
            _check_range("canonical_ranks", options.canonical_ranks, 1, None)
            _check_range("canonical_workers", self.canonical_workers, 1, 1024)
            if self.batch_size is None:
                raise ConfigError(
                    "canonical_ranks needs batch_size: the same global batches are made of "
                    "every rank's batch of one step"
                )
        self.plan  # noqa: B018 - validates the planning options too

    def with_facts(self, facts: DatasetFacts) -> Settings:
        """These settings for a dataset with ``facts``."""
        return dataclasses.replace(self, facts=facts)

    @functools.cached_property
    def order(self) -> OrderChoice:
        """The order's chunk size, lanes and piece size: as set, or chosen from the facts."""
        given = {name: getattr(self.options, name) for name in _ORDER_FIELDS}
        return choose_order(self.facts, **given, batch_size=self.micro_batch)

    @property
    def open_shards(self) -> int:
        """Shards a worker reads at once without a manifest (within a quarter of the files
        the process may open: each open shard holds one)."""
        return max(1, min(choose_open_shards(self.facts, self.options.num_open),
                          file_budget(0.25, 4096)))  # fmt: skip

    @functools.cached_property
    def plan(self) -> PlanOptions:
        """What fixes the epoch's order (see :mod:`shardstream.streaming._planning`)."""
        return PlanOptions(
            self.seed, self.shuffle, self.policy, **dataclasses.asdict(self.order),
            interleave=self.options.interleave,
        )  # fmt: skip

    @property
    def micro_batch(self) -> int:
        """Samples per step of one rank: the batch size, or 1 without batching."""
        return self.batch_size or 1

    @property
    def canonical_workers(self) -> int:
        """Streams per planned rank when ``canonical_ranks`` is set."""
        return self.options.canonical_workers or _DEFAULT_CANONICAL_WORKERS

    def read(self, tag_streams: bool) -> ReadSettings:
        """How workers read shards."""
        options = self.options
        return ReadSettings(
            options.max_member_bytes, options.memory_map, self.on_error, tag_streams,
            max(8, min(self.order.num_open, file_budget(0.25, 4096))),
            max(256, 2 * self.order.num_open),
            fields=options.output == "dict",  # pairs are (image, label): no other field
        )  # fmt: skip

    def plan_layout(self, physical: Layout) -> Layout:
        """The layout a fresh pass is planned for: the canonical one if set, else ``physical``.

        Raises:
            ConfigError: The world size does not divide ``canonical_ranks``, or the global
                batch (``batch_size * world_size``) is not a multiple of it.
        """
        ranks = self.options.canonical_ranks
        if ranks is None:
            return physical
        world, batch = physical.world_size, physical.batch_size
        if ranks % world or (batch * world) % ranks:
            raise ConfigError(
                f"canonical_ranks={ranks} needs a world size that divides it and a global "
                f"batch (batch_size x world_size = {batch} x {world}) that is a multiple of it"
            )
        return Layout(ranks, self.canonical_workers, batch * world // ranks)

    def fingerprint(self) -> dict[str, Any]:
        """The settings that fix which samples an epoch holds and their order."""
        options = self.options
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "policy": self.policy,
            **dataclasses.asdict(self.order),
            "interleave": options.interleave,
            "shuffle_buffer": options.shuffle_buffer,
        }


def _check_range(name: str, value: int, low: int, high: int | None) -> None:
    if not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f"[{low}, {high}]" if high is not None else f">= {low}"
        raise ConfigError(f"{name} must be an integer {bounds}, got {value!r}")
