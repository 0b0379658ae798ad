"""An epoch's samples in chunks from all over the dataset: a seeded bijection, no table.

Shards are often written in class, source or video order. Reading an epoch as whole shards in
a shuffled order, even through many lanes at once, keeps each stretch of the epoch inside a few
shards, so batches hold few classes and the class mix drifts as the epoch goes on: a model
trains worse than on a random permutation (mosaic-streaming's block shuffles and the CorgiPile
papers measure the same). A :class:`ChunkSequence` cuts the epoch's shard-ordered samples into
*chunks* of ``chunk_size`` consecutive samples and puts the chunks in a seeded pseudo-random
order. Any stretch of the epoch (a rank's part, a lane, a window) then comes from chunks of
random shards, so every rank and worker sees the whole dataset's mix all epoch long, while each
chunk is still read front to back (one ranged read, or one memory map, per piece).

The order is a keyed Feistel network over the chunk numbers, walked in cycles until it lands
inside the range: a bijection computed per chunk in a few microseconds, with no permutation
table, so its cost does not grow with the dataset (a billion samples in chunks of 4 are 250
million chunks).
The last, shorter chunk stays at the end, so every other chunk has the same length and a
position's chunk is a division.

The epoch order's options and defaults, in one place: what fixes an epoch's order
(:class:`PlanOptions`), the numbers chosen from the dataset when the user leaves them
(:func:`choose_order`), and the sequence a fresh epoch reads (:func:`epoch_sequence`)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from shardstream._catalog.shardlist import DatasetFacts
from shardstream.errors import ConfigError
from shardstream.streaming._planning.sequence import BaseSequence, Run, ShardSequence, shard_order

__all__ = [
    "ChunkOrder",
    "ChunkSequence",
    "DatasetFacts",
    "LOCAL_ORDER",
    "INTERLEAVES",
    "OrderChoice",
    "POLICIES",
    "PlanOptions",
    "REMOTE_PIECE_BYTES",
    "REMOTE_READ_BYTES",
    "REMOTE_WINDOW_BYTES",
    "UNINDEXED_WASTE_BYTES",
    "WHOLE_SHARD_ORDER",
    "choose_open_shards",
    "choose_order",
    "epoch_sequence",
    "remote_piece_bytes",
    "unindexed_order",
]


_MASK64 = (1 << 64) - 1
_ROUNDS = 4
_CHUNK_TAG = 0xC4A2


def _mix(value: int) -> int:
    """SplitMix64's finaliser: a fast 64-bit hash with full avalanche."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def _mix_all(values: np.ndarray) -> np.ndarray:
    """:func:`_mix` of every ``uint64`` value (numpy's products wrap modulo 2**64, as the mask
    does)."""
    values = (values ^ (values >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    values = (values ^ (values >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return values ^ (values >> np.uint64(31))


class ChunkOrder:
    """A seeded bijection of ``range(num_chunks)`` onto itself (a keyed Feistel network).

    Args:
        num_chunks: Size of the range.
        keys: One round key per Feistel round (see :meth:`seeded`).

    Examples:
        >>> order = ChunkOrder.seeded(10, [0, 1])
        >>> sorted(order(number) for number in range(10)) == list(range(10))
        True
    """

    def __init__(self, num_chunks: int, keys: list[int]) -> None:
        self.num_chunks = num_chunks
        bits = max(2, (max(1, num_chunks - 1)).bit_length())
        self._half = (bits + 1) // 2  # balanced halves over the next even number of bits
        self._half_mask = (1 << self._half) - 1
        self._keys = keys

    @classmethod
    def seeded(cls, num_chunks: int, seed: list[int]) -> ChunkOrder:
        """The order for ``num_chunks`` chunks drawn from the seed sequence ``seed``."""
        keys = np.random.default_rng([*seed, _CHUNK_TAG]).integers(0, 1 << 62, _ROUNDS)
        return cls(num_chunks, [int(key) for key in keys])

    def salted(self, salt: int) -> ChunkOrder:
        """Another order of the same size, from this one's keys and ``salt`` (cheap: no RNG)."""
        return ChunkOrder(self.num_chunks, [_mix(key ^ salt) for key in self._keys])

    def _once(self, value: int) -> int:
        half, mask = self._half, self._half_mask
        left, right = value >> half, value & mask
        for key in self._keys:
            left, right = right, left ^ (_mix(right ^ key) & mask)
        return (left << half) | right

    def __call__(self, number: int) -> int:
        """Where chunk ``number`` of the epoch's order comes from."""
        value = self._once(number)
        while value >= self.num_chunks:  # cycle walking: at most 4x the range, ~2 steps
            value = self._once(value)
        return value

    def _once_all(self, values: np.ndarray) -> np.ndarray:
        half, mask = np.uint64(self._half), np.uint64(self._half_mask)
        left, right = values >> half, values & mask
        for key in self._keys:
            left, right = right, left ^ (_mix_all(right ^ np.uint64(key)) & mask)
        return (left << half) | right

    def many(self, numbers: np.ndarray) -> np.ndarray:
        """Where each chunk of ``numbers`` comes from (what calling the order on each gives),
        in a few numpy calls."""
        values = self._once_all(numbers.astype(np.uint64))
        walking = np.flatnonzero(values >= self.num_chunks)
        while len(walking):
            values[walking] = self._once_all(values[walking])
            walking = walking[values[walking] >= self.num_chunks]
        return values.astype(np.int64)


class ChunkSequence(BaseSequence):
    """An epoch's samples: chunks of shard-ordered samples, in a seeded order.

    Positions ``[0, length)`` are read in chunks of ``chunk_size``; chunk ``j`` holds the
    shard-ordered samples of chunk ``order(j)``. Memory is that of the shard order (two
    integers per shard); :meth:`locate` costs a bijection and a binary search per chunk.

    Args:
        shards: The epoch's shards in their order.
        chunk_size: Samples per chunk (>= 1).
        seed: Seed sequence of the chunk order, e.g. ``[seed, epoch]``.
        shuffle: Put the chunks in a seeded order (False keeps them in shard order).

    Examples:
        >>> shards = ShardSequence(np.array([4, 4]), np.array([0, 1]))
        >>> sequence = ChunkSequence(shards, 2, [0, 0])
        >>> sorted((run.shard, run.first) for run in sequence.locate(0, 8))
        [(0, 0), (0, 2), (1, 0), (1, 2)]
    """

    def __init__(
        self, shards: ShardSequence, chunk_size: int, seed: list[int], shuffle: bool = True
    ) -> None:
        self.shards, self.chunk_size = shards, max(1, chunk_size)
        self.length = shards.length
        self.num_full = self.length // self.chunk_size
        self.order = ChunkOrder.seeded(self.num_full, seed) if shuffle else None

    def _inner(self, position: int) -> int:
        """The shard-ordered position of epoch position ``position``."""
        number, offset = divmod(position, self.chunk_size)
        if number >= self.num_full or self.order is None:
            return position
        return self.order(number) * self.chunk_size + offset

    def locate_many(self, ranges: Sequence[tuple[int, int]]) -> list[list[Run]]:
        """:meth:`locate` of each range ``(start, stop)``, the chunks of all of them ordered
        and found in their shards at once (a window's ranges: hundreds of short ones)."""
        found: list[list[Run]] = [[] for _ in ranges]
        if not ranges:
            return found
        bounds = np.array(ranges, dtype=np.int64).reshape(-1, 2)
        starts, stops = bounds[:, 0], bounds[:, 1]
        size, full_end = self.chunk_size, self.num_full * self.chunk_size
        # Each range's pieces: cut at chunk boundaries below the last full chunk, one past it.
        first_chunks = starts // size
        chunked_ends = np.minimum(stops, full_end)
        num_chunked = np.where(
            chunked_ends > starts, (chunked_ends - 1) // size - first_chunks + 1, 0
        )
        counts = num_chunked + (stops > np.maximum(starts, full_end))
        owners = np.repeat(np.arange(len(starts)), counts)
        steps = np.arange(len(owners)) - np.repeat(np.cumsum(counts) - counts, counts)
        tails = steps >= num_chunked[owners]
        chunks = first_chunks[owners] + steps
        begins = np.where(tails, np.maximum(starts[owners], full_end),
                          np.maximum(starts[owners], chunks * size))  # fmt: skip
        ends = np.where(tails, stops[owners], np.minimum(stops[owners], (chunks + 1) * size))
        inner = begins.copy()  # the shard-ordered position of each piece's start
        if self.order is not None and not tails.all():
            chunked = ~tails
            offsets = begins[chunked] - chunks[chunked] * size
            inner[chunked] = self.order.many(chunks[chunked]) * size + offsets
        pieces, shards, firsts, run_stops, positions = self.shards.spans(
            inner, inner + ends - begins
        )
        positions += begins[pieces] - inner[pieces]
        for piece, shard, first, stop, position in zip(
            owners[pieces].tolist(), shards.tolist(), firsts.tolist(), run_stops.tolist(),
            positions.tolist(), strict=True,
        ):  # fmt: skip
            found[piece].append(Run(shard, first, stop, position))
        return found

    def locate(self, start: int, stop: int) -> list[Run]:
        """The runs holding positions ``[start, stop)`` (within ``[0, length)``), in order."""
        runs: list[Run] = []
        size = self.chunk_size
        while start < stop:
            end = stop if start >= self.num_full * size else min(stop, (start // size + 1) * size)
            inner = self._inner(start)
            for run in self.shards.locate(inner, inner + end - start):
                runs.append(run._replace(position=start + run.position - inner))
            start = end
        return runs


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


#: How a window's pieces take turns: ``"stratified"`` (each stretch of as many samples as the
#: window has pieces holds about one of each) or ``"uniform"`` (a uniformly random interleave:
#: the order of shardstream 0.2 and earlier, which states saved by them continue in).
INTERLEAVES = ("stratified", "uniform")
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
        chunk_size: Samples per chunk of the epoch's order (see this module); 0 reads
            whole shards in a seeded order.
        interleave: How a window's pieces take turns (see
            :func:`~shardstream.streaming._planning.windows.interleave_labels`):
            ``"stratified"``, or ``"uniform"`` (the order of shardstream 0.2 and earlier).
    """

    seed: int = 0
    shuffle: bool = True
    policy: str = "pad"
    block_size: int = WHOLE_SHARD_ORDER.block_size
    piece_size: int = WHOLE_SHARD_ORDER.piece_size
    num_open: int = WHOLE_SHARD_ORDER.num_open
    chunk_size: int = WHOLE_SHARD_ORDER.chunk_size
    interleave: str = "stratified"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ConfigError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.interleave not in INTERLEAVES:
            raise ConfigError(f"interleave must be one of {INTERLEAVES}, got {self.interleave!r}")
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
