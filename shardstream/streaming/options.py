"""StreamOptions: the less common settings of a StreamingDataset, in one frozen dataclass."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from shardstream.errors import ConfigError
from shardstream.format.tarreader import DEFAULT_MAX_MEMBER_BYTES
from shardstream.storage import ReadOptions
from shardstream.storage.redact import redacted_repr

__all__ = ["DecodeMode", "OnError", "Output", "Policy", "StreamOptions", "with_storage_options"]

#: What ``decode=`` names: encoded bytes, a PIL image, a uint8 CHW tensor, or the GPU's decode
#: (``"cuda:N"`` for device N); a callable ``f(bytes, extension)`` is taken too.
DecodeMode = Literal["raw", "pil", "rgb8", "cuda"]
#: How epochs are evened across ranks (see ``StreamingDataset``).
Policy = Literal["pad", "drop", "mask"]
#: What a corrupt sample or truncated shard does.
OnError = Literal["raise", "skip"]
#: What a sample is: ``(image, label)`` or a dict of every field.
Output = Literal["pair", "dict"]


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
