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
"""

from __future__ import annotations

import numpy as np

from shardstream.streaming.planning.sequence import BaseSequence, Run, ShardSequence

__all__ = ["ChunkOrder", "ChunkSequence"]

_MASK64 = (1 << 64) - 1
_ROUNDS = 4
_CHUNK_TAG = 0xC4A2


def _mix(value: int) -> int:
    """SplitMix64's finaliser: a fast 64-bit hash with full avalanche."""
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


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
