"""The epoch order's options and defaults, in one place: what fixes an epoch's order
(:class:`PlanOptions`), the numbers chosen from the dataset when the user leaves them
(:func:`choose_order`), and the sequence a fresh epoch reads (:func:`epoch_sequence`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from shardstream.catalog.facts import DatasetFacts
from shardstream.errors import ConfigError
from shardstream.streaming.planning.chunkorder import ChunkSequence
from shardstream.streaming.planning.sequence import BaseSequence, ShardSequence, shard_order

__all__ = [
    "LOCAL_ORDER",
    "POLICIES",
    "REMOTE_PIECE_BYTES",
    "REMOTE_READ_BYTES",
    "REMOTE_WINDOW_BYTES",
    "UNINDEXED_WASTE_BYTES",
    "WHOLE_SHARD_ORDER",
    "DatasetFacts",
    "OrderChoice",
    "PlanOptions",
    "choose_open_shards",
    "choose_order",
    "epoch_sequence",
    "remote_piece_bytes",
    "unindexed_order",
]

POLICIES = ("pad", "drop", "mask")
#: A piece from an object store (a request costs 10-50 ms before its first byte; 1 MiB at a few
#: hundred MB/s costs about as much again, so reads should average at least that).
REMOTE_PIECE_BYTES = 2 << 20
#: What reads from an object store should average, shard ends included (see
#: :func:`remote_piece_bytes`).
REMOTE_READ_BYTES = 5 << 18  # 1.25 MiB
#: The longest piece chosen for short shards.
_REMOTE_MAX_PIECE_BYTES = 8 << 20
#: About what one worker stream's window holds in memory when reading remote shards.
REMOTE_WINDOW_BYTES = 256 << 20
#: Shards read at once by a worker without a manifest: each is an open stream (a file, or a
#: remote stream with its read-ahead), so remote ones are fewer.
_OPEN_SHARDS_LOCAL = 256
_OPEN_SHARDS_REMOTE = 64


@dataclasses.dataclass(frozen=True)
class OrderChoice:
    """The order's numbers: ``chunk_size``, ``num_open``, ``piece_size`` and ``block_size``
    (see :class:`PlanOptions`)."""

    chunk_size: int
    num_open: int
    piece_size: int
    block_size: int = 64


#: Shards without an index, which can only be entered at their start: whole shards in a
#: seeded order, 64 lanes of 64 samples (the earlier whole-shard order). Also the defaults
#: of :class:`PlanOptions`.
WHOLE_SHARD_ORDER = OrderChoice(chunk_size=0, num_open=64, piece_size=64, block_size=64)
#: Chunks per shard of counted shards without an index, at least (see :func:`unindexed_order`).
_UNINDEXED_CHUNKS_PER_SHARD = 4
#: Bytes passed over (decompressed or walked) per sample read that make a chunk short enough.
UNINDEXED_WASTE_BYTES = 128 << 10
#: Local shards with an index: a short run costs about 10 us (a memory map's slice), so short
#: chunks and pieces from many lanes (a window of about 4,096 samples from 1,000 places).
LOCAL_ORDER = OrderChoice(chunk_size=4, num_open=512, piece_size=8, block_size=64)


@dataclasses.dataclass(frozen=True)
class PlanOptions:
    """How an epoch is laid out and ordered; identical on every rank and worker.

    Attributes:
        seed: Base seed of every random choice.
        shuffle: Permute the shard order and interleave pieces per epoch.
        policy: ``"pad"``, ``"drop"`` or ``"mask"`` (see :mod:`.split`).
        block_size: Samples per unit dealt to worker streams, rounded up to the batch size.
        piece_size: Longest run of consecutive samples read from one place of a shard.
        num_open: Pieces interleaved at once: a worker stream is read in windows of about
            ``num_open * piece_size`` samples whose pieces are interleaved at random.
        chunk_size: Samples per chunk of the epoch's order (see :mod:`.chunkorder`); 0 reads
            whole shards in a seeded order.
    """

    seed: int = 0
    shuffle: bool = True
    policy: str = "pad"
    block_size: int = WHOLE_SHARD_ORDER.block_size
    piece_size: int = WHOLE_SHARD_ORDER.piece_size
    num_open: int = WHOLE_SHARD_ORDER.num_open
    chunk_size: int = WHOLE_SHARD_ORDER.chunk_size

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.chunk_size < 0:
            raise ConfigError(f"chunk_size must be >= 0, got {self.chunk_size}")
        for name in ("block_size", "piece_size", "num_open"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


def choose_order(
    facts: DatasetFacts,
    chunk_size: int | None = None,
    num_open: int | None = None,
    piece_size: int | None = None,
    block_size: int | None = None,
    batch_size: int = 1,
) -> OrderChoice:
    """The order's numbers: those given, the rest chosen from ``facts``.

    Smaller chunks mix more evenly, and a batch holds samples from about ``min(batch,
    num_open)`` places; what a read costs sets the floor (README, *Shuffle quality*, has the
    measurements): :func:`unindexed_order` without an index, :data:`LOCAL_ORDER` for local
    indexed shards (``facts.local``: also remote ones that a local cache holds whole), and for
    remote ones pieces of at least ``REMOTE_PIECE_BYTES`` (more in
    short shards, see :func:`remote_piece_bytes`), a multiple of ``batch_size`` (the units
    dealt to worker streams are whole batches, and a unit longer than its piece would cut
    pieces at chunk ends: two reads), chunks of two pieces, and as many lanes as
    ``REMOTE_WINDOW_BYTES`` of pieces hold (32 to 512). Values given are kept as they are.

    Examples:
        >>> choose_order(DatasetFacts(indexed=True, local=True, mean_sample_bytes=110e3))
        OrderChoice(chunk_size=4, num_open=512, piece_size=8, block_size=64)
        >>> choose_order(DatasetFacts(True, False, 10e3))
        OrderChoice(chunk_size=420, num_open=127, piece_size=210, block_size=210)
        >>> choose_order(DatasetFacts(False, True, 0.0), num_open=16)
        OrderChoice(chunk_size=0, num_open=16, piece_size=64, block_size=64)
    """
    chosen: OrderChoice
    if not facts.indexed:
        chosen = unindexed_order(facts)
    elif facts.local:
        chosen = LOCAL_ORDER
    else:
        sample = max(1.0, facts.mean_sample_bytes)
        wanted = math.ceil(remote_piece_bytes(facts.mean_shard_bytes) / sample)
        piece = piece_size or min(4096, max(LOCAL_ORDER.piece_size, wanted))
        piece = -(-piece // max(1, batch_size)) * max(1, batch_size) if not piece_size else piece
        lanes = min(LOCAL_ORDER.num_open, max(32, int(REMOTE_WINDOW_BYTES // (piece * sample))))
        chosen = OrderChoice(2 * piece, lanes, piece, piece)
    given = {
        "chunk_size": chunk_size, "num_open": num_open, "piece_size": piece_size,
        "block_size": block_size,
    }  # fmt: skip
    return dataclasses.replace(chosen, **{k: v for k, v in given.items() if v is not None})


def unindexed_order(facts: DatasetFacts) -> OrderChoice:
    """The order of counted shards without a byte index (gzipped ones): chunks of shards.

    Such a shard is entered only at its start (a piece of it decompresses or walks everything
    before it), so whole shards would cost least; but whole shards keep each shard's samples
    in their written order, and a dataset of few shards would be read nearly as written in
    every epoch, whatever the seed. So the epoch is read in chunks from all over the dataset,
    as with an index, each as short as costs at most ``UNINDEXED_WASTE_BYTES`` of bytes
    passed over per sample read (a piece passes over half its shard on average), and never
    longer than a quarter of a shard (then at most 2.5 times the decompression of one
    sequential read). Without counts (no manifest): :data:`WHOLE_SHARD_ORDER`.

    Examples:
        >>> unindexed_order(DatasetFacts(False, True, 10e3, 900e3))  # small shards: short
        OrderChoice(chunk_size=4, num_open=64, piece_size=4, block_size=64)
        >>> unindexed_order(DatasetFacts(False, True, 100e3, 1e9))  # large: quarter shards
        OrderChoice(chunk_size=2500, num_open=64, piece_size=2500, block_size=64)
    """
    if facts.mean_sample_bytes <= 0 or facts.mean_shard_bytes <= 0:
        return WHOLE_SHARD_ORDER
    per_shard = facts.mean_shard_bytes / facts.mean_sample_bytes
    quarter = per_shard / _UNINDEXED_CHUNKS_PER_SHARD
    cheap = facts.mean_shard_bytes / 2 / UNINDEXED_WASTE_BYTES
    chunk = max(1, math.ceil(min(quarter, cheap)))
    return dataclasses.replace(WHOLE_SHARD_ORDER, chunk_size=chunk, piece_size=chunk)


def remote_piece_bytes(mean_shard_bytes: float) -> float:
    """Bytes of a remote piece: reads average ``REMOTE_READ_BYTES`` with shard ends counted.

    A piece of ``p`` bytes from shards of ``s`` bytes is cut by a shard end about ``p / s``
    times, so reads average ``1 / (1 / p + 1 / s)`` bytes; ``p`` is the smallest that makes
    that ``REMOTE_READ_BYTES``, at least ``REMOTE_PIECE_BYTES`` and at most 8 MiB.

    Examples:
        >>> remote_piece_bytes(64 << 20) == REMOTE_PIECE_BYTES
        True
        >>> round(remote_piece_bytes(2e6) / 2**20, 2)
        3.63
    """
    if mean_shard_bytes <= 0:
        return REMOTE_PIECE_BYTES
    room = 1 / REMOTE_READ_BYTES - 1 / mean_shard_bytes
    if room <= 1 / _REMOTE_MAX_PIECE_BYTES:
        return _REMOTE_MAX_PIECE_BYTES
    return min(_REMOTE_MAX_PIECE_BYTES, max(REMOTE_PIECE_BYTES, 1 / room))


def choose_open_shards(facts: DatasetFacts, num_open: int | None = None) -> int:
    """Shards a worker reads at once when there is no manifest (``num_open`` if given).

    A worker without a manifest reads whole shards, each next sample from a random open one,
    so a batch holds samples of at most this many shards: many locally (an open file costs a
    descriptor and a small buffer), fewer remotely (each holds a stream and its read-ahead).

    Examples:
        >>> choose_open_shards(DatasetFacts(False, True, 0.0))
        256
    """
    if num_open is not None:
        return num_open
    return _OPEN_SHARDS_LOCAL if facts.local else _OPEN_SHARDS_REMOTE


def epoch_sequence(counts: np.ndarray, seed: int, epoch: int, options: PlanOptions) -> BaseSequence:
    """A fresh epoch's sequence of a dataset with ``counts`` samples per shard.

    Whole shards in a seeded order when ``options.chunk_size`` is 0, else chunks of that many
    samples from all over the dataset (:class:`~.chunkorder.ChunkSequence`).

    Examples:
        >>> epoch_sequence(np.array([3, 3]), 0, 0, PlanOptions(chunk_size=0)).length
        6
    """
    order = shard_order(len(counts), seed, epoch, options.shuffle)
    shards = ShardSequence(counts, order)
    if options.chunk_size <= 0 or not options.shuffle:
        return shards
    return ChunkSequence(shards, options.chunk_size, [seed, epoch])
