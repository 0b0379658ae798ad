"""Virtual sequences: the samples of an epoch (or of what is left of it) in reading order.

An epoch is read as one long *virtual sequence* of samples that the plan cuts into equal parts
for the ranks. The sequence is never a list of samples: it is the epoch's shard order with the
cumulative sample counts (:class:`ShardSequence`, or a mixture's, see
:mod:`~shardstream.streaming._planning.mixing`), and what is left of an epoch after a restart is
a :class:`DerivedSequence` of its positions (see :mod:`~.leftover`). Finding the shards behind
any range of positions is a binary search, so nothing here costs time or memory per sample.

A *run* is ``(shard, first, stop, position)``: samples ``[first, stop)`` of shard number
``shard`` (an index into the dataset's shard list), which sit at base-sequence positions
``[position, position + stop - first)``.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

__all__ = [
    "BaseSequence",
    "DerivedSequence",
    "PassSequence",
    "Run",
    "ShardSequence",
    "last_at_most",
    "shard_order",
]


class Run(NamedTuple):
    """Samples ``[first, stop)`` of shard ``shard``, at base positions from ``position``."""

    shard: int
    first: int
    stop: int
    position: int

    @property
    def num_samples(self) -> int:
        """Samples in the run."""
        return self.stop - self.first


class BaseSequence(abc.ABC):
    """An epoch's whole sequence: positions ``[0, length)`` map to shard samples.

    Like a :class:`DerivedSequence`, it names its ``base`` (itself) and its positions as
    ``base_ranges`` (themselves), so a pass reads either through the same two questions.
    """

    length: int

    @property
    def base(self) -> BaseSequence:
        """The epoch's whole sequence: this one."""
        return self

    def base_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Positions ``[start, stop)`` as base positions: themselves."""
        return [(start, stop)] if start < stop else []

    @abc.abstractmethod
    def locate(self, start: int, stop: int) -> list[Run]:
        """The runs holding positions ``[start, stop)``, in order."""

    def locate_many(self, ranges: Sequence[tuple[int, int]]) -> list[list[Run]]:
        """:meth:`locate` of each range ``(start, stop)`` (a sequence may answer them at once)."""
        return [self.locate(start, stop) for start, stop in ranges]


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The epoch's shard order: a permutation seeded by ``(seed, epoch)``, or ``0..n-1``.

    Examples:
        >>> shard_order(4, seed=0, epoch=0, shuffle=False).tolist()
        [0, 1, 2, 3]
    """
    # 32-bit numbers halve the memory and time of ten million shards; shuffled in place, they
    # are the same permutation as ``permutation(num_shards)`` (the order of earlier releases).
    order = np.arange(num_shards, dtype=np.int32 if num_shards < 2**31 else np.int64)
    if shuffle:
        np.random.default_rng([seed, epoch, 0x5EED]).shuffle(order)
    return order


class ShardSequence(BaseSequence):
    """Whole shards in a given order (empty ones left out): a fresh epoch of one dataset.

    Memory is two integers per shard; :meth:`locate` is a binary search.

    Args:
        counts: Samples per shard, in shard-list order.
        order: The shards in reading order (see :func:`shard_order`).

    Examples:
        >>> sequence = ShardSequence(np.array([3, 0, 2]), np.array([2, 1, 0]))
        >>> sequence.length, sequence.locate(1, 4)
        (5, [Run(shard=2, first=1, stop=2, position=1), Run(shard=0, first=0, stop=2, position=2)])
    """

    def __init__(self, counts: np.ndarray, order: np.ndarray) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        if len(counts) and int(counts.max()) < 2**31:
            counts = counts.astype(np.int32)  # the random gather below reads half the memory
        ordered = counts[order]
        kept = ordered > 0
        if not kept.all():
            order, ordered = order[kept], ordered[kept]
        self.order = order
        self.starts = np.zeros(len(order) + 1, dtype=np.int64)
        np.cumsum(ordered, dtype=np.int64, out=self.starts[1:])
        self.length = int(self.starts[-1])

    def spans(self, starts: np.ndarray, stops: np.ndarray) -> tuple[np.ndarray, ...]:
        """The runs of each non-empty range ``[starts[i], stops[i])`` at once, as arrays:
        ``(range, shard, first, stop, position)``, one entry per run, in order."""
        first_slots = np.searchsorted(self.starts, starts, side="right") - 1
        last_slots = np.searchsorted(self.starts, stops - 1, side="right") - 1
        counts = last_slots - first_slots + 1
        ranges = np.repeat(np.arange(len(starts)), counts)
        slots = np.arange(len(ranges)) - np.repeat(np.cumsum(counts) - counts, counts)
        slots += first_slots[ranges]
        begins = self.starts[slots]
        positions = np.maximum(starts[ranges], begins)
        ends = np.minimum(stops[ranges], self.starts[slots + 1])
        shards = self.order[slots].astype(np.int64)
        return ranges, shards, positions - begins, ends - begins, positions

    def locate(self, start: int, stop: int) -> list[Run]:
        """The runs holding positions ``[start, stop)`` (within ``[0, length)``)."""
        runs: list[Run] = []
        if start >= stop:
            return runs
        slot = int(np.searchsorted(self.starts, start, side="right")) - 1
        position = start
        while position < stop:
            begin, end = int(self.starts[slot]), int(self.starts[slot + 1])
            take_stop = min(stop, end)
            shard = int(self.order[slot])
            runs.append(Run(shard, position - begin, take_stop - begin, position))
            position = take_stop
            slot += 1
        return runs


class DerivedSequence(abc.ABC):
    """Positions of an epoch's whole sequence in another order: what it left after a restart.

    Attributes:
        base: The epoch's whole sequence.
        length: Positions of this sequence.
    """

    base: BaseSequence
    length: int

    @abc.abstractmethod
    def base_ranges(self, start: int, stop: int) -> list[tuple[int, int]]:
        """Positions ``[start, stop)`` as base positions: the longest ranges of consecutive
        ones (so the runs behind a position do not depend on how it is computed)."""

    def locate(self, start: int, stop: int) -> list[Run]:
        """The runs holding positions ``[start, stop)``, in order."""
        runs: list[Run] = []
        for first, end in self.base_ranges(start, stop):
            runs.extend(self.base.locate(first, end))
        return runs


#: What a pass reads: a fresh epoch's sequence, or what earlier passes of the epoch left.
PassSequence = BaseSequence | DerivedSequence


def last_at_most(start_of: Callable[[int], int], position: int, low: int, high: int) -> int:
    """The last ``i`` in ``[low, high]`` with ``start_of(i) <= position`` (``start_of`` rising,
    ``start_of(low) <= position``): the window, slot or run that holds ``position``.

    Examples:
        >>> last_at_most(lambda i: 10 * i, 35, 0, 9)
        3
    """
    while low < high:
        middle = (low + high + 1) // 2
        if start_of(middle) <= position:
            low = middle
        else:
            high = middle - 1
    return low
