"""Mixtures: several datasets read as one, in exact per-epoch proportions.

Each :class:`Stream` gets a per-epoch quota of samples: ``proportion`` of ``epoch_size`` (the
rounding remainders go to the largest fractions, so the quotas add up to ``epoch_size``), or
``repeat`` times its own size. A stream's samples are laid out in an endless cycle of passes,
each pass its shards in a seeded order; epoch ``e`` takes the quota-long window that starts at
``e * quota``. So every stream visits all its samples before repeating any, across epochs, and
a stream smaller than its quota repeats whole passes first, then a partial one.

The windows are cut into runs of at most ``piece_size`` samples and the runs of all streams
are shuffled together (seeded per epoch), giving one virtual sequence that the ordinary epoch
plan splits equally across ranks and workers; each worker then interleaves its pieces and
shuffles them through one buffer, so batches mix the streams.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardstream.errors import ConfigError
from shardstream.storage import ReadOptions, Store
from shardstream.streaming.planning.split import Piece, PlanOptions, cut_sequence, epoch_sequence
from shardstream.streaming.shardlist import ShardSpec, Source, resolve_source

__all__ = ["Mixture", "Stream", "stream_quotas"]


@dataclasses.dataclass(frozen=True)
class Stream:
    """One dataset of a mixture.

    Attributes:
        source: Anything :class:`~shardstream.streaming.StreamingDataset` reads, with a
            manifest (a dataset folder or URL): the counts make the proportions exact.
        proportion: Share of each epoch (of ``epoch_size``); relative, need not sum to 1.
        repeat: Samples per epoch as a multiple of the stream's size (0.5: half, 2.0: twice);
            used when no stream has a ``proportion``; 1.0 when neither is given.
        name: Shown in summaries; defaults to the source.
        storage_options: fsspec options for this stream's URLs.
        read_options: Retries, read-ahead and cache for this stream.

    Example:
        >>> Stream("s3://bucket/web", proportion=0.7).proportion
        0.7
    """

    source: Source
    proportion: float | None = None
    repeat: float | None = None
    name: str | None = None
    storage_options: Mapping[str, Any] | None = None
    read_options: ReadOptions | None = None


def stream_quotas(
    sizes: Sequence[int],
    proportions: Sequence[float | None],
    repeats: Sequence[float | None],
    epoch_size: int | None,
) -> list[int]:
    """Samples each stream gives per epoch.

    Raises:
        ConfigError: Proportions mixed with plain streams, proportions without
            ``epoch_size``, ``epoch_size`` without proportions, or negative values.

    Example:
        >>> stream_quotas([100, 10], [0.7, 0.3], [None, None], 1001)
        [701, 300]
        >>> stream_quotas([100, 10], [None, None], [0.5, 2.0], None)
        [50, 20]
    """
    if any(p is not None and r is not None for p, r in zip(proportions, repeats, strict=True)):
        raise ConfigError("give a stream either proportion or repeat, not both")
    values = [v for v in (*proportions, *repeats) if v is not None]
    if any(not math.isfinite(v) or v < 0 for v in values):
        raise ConfigError(f"proportions and repeats must be finite and >= 0, got {values}")
    if any(p is not None for p in proportions):
        if any(p is None for p in proportions):
            raise ConfigError("when one stream has a proportion, every stream needs one")
        if epoch_size is None or epoch_size < 1:
            raise ConfigError("proportions need epoch_size (samples per epoch, over all ranks)")
        weights = np.array(proportions, dtype=float)
        if weights.sum() <= 0:
            raise ConfigError("the proportions add up to 0")
        exact = weights / weights.sum() * epoch_size
        quotas = np.floor(exact).astype(np.int64)
        order = sorted(range(len(quotas)), key=lambda i: (-(exact[i] - quotas[i]), i))
        for index in order[: epoch_size - int(quotas.sum())]:
            quotas[index] += 1
        return [int(q) for q in quotas]
    if epoch_size is not None:
        raise ConfigError("epoch_size applies to streams with proportions; with repeat it is set")
    factors = [1.0 if r is None else r for r in repeats]
    return [math.floor(size * factor + 0.5) for size, factor in zip(sizes, factors, strict=True)]


@dataclasses.dataclass(frozen=True)
class _Resolved:
    name: str
    first_shard: int  # index of its first shard in the mixture's shard list
    counts: tuple[int, ...]
    quota: int
    seed: int


class Mixture:
    """Streams resolved to stores and shards, with their per-epoch quotas.

    Args:
        streams: The streams, each with a manifest.
        epoch_size: Samples per epoch over all ranks (required with proportions).
        seed: The dataset's seed.
    """

    def __init__(self, streams: Sequence[Stream], epoch_size: int | None, seed: int) -> None:
        if not streams:
            raise ConfigError("a mixture needs at least one Stream")
        self.stores: list[Store] = []
        self.shards: list[ShardSpec] = []
        resolved = []
        for index, stream in enumerate(streams):
            store, shards, manifest = resolve_source(
                stream.source, stream.storage_options, stream.read_options
            )
            if manifest is None:
                raise ConfigError(
                    f"stream {index} ({stream.source!r}) has no manifest; a mixture needs every "
                    "stream's sample counts to keep its proportions exact"
                )
            first = len(self.shards)
            self.stores.append(store)
            self.shards.extend(dataclasses.replace(spec, store=index) for spec in shards)
            counts = tuple(spec.num_samples or 0 for spec in shards)
            name = stream.name or store.shown()
            seed_sequence = np.random.SeedSequence([seed, index, 0x6D1C])
            resolved.append((name, first, counts, int(seed_sequence.generate_state(1)[0])))
        quotas = stream_quotas(
            [sum(counts) for _, _, counts, _ in resolved],
            [stream.proportion for stream in streams],
            [stream.repeat for stream in streams],
            epoch_size,
        )
        self.streams = [
            _Resolved(name, first, counts, quota, stream_seed)
            for (name, first, counts, stream_seed), quota in zip(resolved, quotas, strict=True)
        ]
        self.epoch_size = sum(quotas)
        if self.epoch_size == 0:
            raise ConfigError("the mixture takes no samples per epoch")

    def summary(self) -> list[dict[str, Any]]:
        """Per stream: name, samples, samples per epoch and share of the epoch."""
        return [
            {
                "name": stream.name,
                "num_samples": sum(stream.counts),
                "samples_per_epoch": stream.quota,
                "share": stream.quota / self.epoch_size,
            }
            for stream in self.streams
        ]

    def fingerprint(self) -> list[list[Any]]:
        """What fixes the mixture's samples: per stream its size and quota."""
        return [[sum(stream.counts), stream.quota] for stream in self.streams]

    def epoch_sequence(self, epoch: int, plan: PlanOptions) -> list[Piece]:
        """Every stream's window of ``epoch``, in runs of at most ``piece_size``, mixed."""
        runs: list[tuple[float, int, Piece]] = []
        for number, stream in enumerate(self.streams):
            window = self._window(stream, epoch, plan)
            position = 0
            for piece in window:
                for start in range(piece.start, piece.stop, plan.piece_size):
                    run = Piece(piece.shard, start, min(start + plan.piece_size, piece.stop))
                    runs.append(((position + 0.5) / stream.quota, number, run))
                    position += run.num_samples
        if plan.shuffle:
            rng = np.random.default_rng([plan.seed, epoch, 0x3D1C])
            return [runs[i][2] for i in rng.permutation(len(runs))]
        return [run for _, _, run in sorted(runs, key=lambda item: item[:2])]

    @staticmethod
    def _window(stream: _Resolved, epoch: int, plan: PlanOptions) -> list[Piece]:
        """Positions ``[epoch * quota, (epoch + 1) * quota)`` of the stream's pass cycle."""
        size = sum(stream.counts)
        first, end = epoch * stream.quota, (epoch + 1) * stream.quota
        pieces: list[Piece] = []
        stream_plan = dataclasses.replace(plan, seed=stream.seed)
        for cycle in range(first // size, (end - 1) // size + 1 if end > first else 0):
            sequence = [
                Piece(piece.shard + stream.first_shard, piece.start, piece.stop)
                for piece in epoch_sequence(stream.counts, cycle, stream_plan)
            ]
            lo, hi = max(first, cycle * size), min(end, (cycle + 1) * size)
            pieces.extend(cut_sequence(sequence, lo - cycle * size, hi - lo))
        return pieces
