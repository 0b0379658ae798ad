"""Mixtures: several datasets read as one, in exact per-epoch proportions.

:class:`Stream` names one dataset of a mixture and its share; :class:`Mixture` resolves the
streams to stores and shard tables. How an epoch takes each stream's quota, and how the
streams' runs are merged into one sequence, is planning
(:mod:`shardstream.streaming.planning.mixing`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardstream.catalog.shardlist import ShardList, Source, resolve_source, source_of
from shardstream.errors import ConfigError
from shardstream.storage import ReadOptions, StorageOptions
from shardstream.storage.redact import redacted_repr
from shardstream.streaming.planning.mixing import MixedStream, MixtureSequence, stream_quotas
from shardstream.streaming.planning.order import PlanOptions

__all__ = ["Mixture", "Stream", "stream_quotas"]


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
        #: :mod:`shardstream.streaming.control.versionset`).
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
