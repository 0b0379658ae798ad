"""Mixtures as one epoch sequence: exact quotas per stream, interleaved runs, closed form.

Each stream gets a per-epoch quota of samples (:func:`stream_quotas`). A stream's samples are
laid out in an endless cycle of passes, each pass its shards (or chunks, see :mod:`.order`) in
a seeded order; epoch ``e``
takes the quota-long window that starts at ``e * quota``. So every stream visits all its
samples before repeating any, across epochs, and a stream smaller than its quota repeats whole
passes first, then a partial one.

Each window is cut into runs of ``piece_size`` samples (its last run may be shorter), and the
runs of all streams are merged into one sequence in exact proportion: a binary tree over the
streams in which every node spreads its two sides' runs evenly (``floor``-based, with a seeded
offset per node and epoch). Every stretch of the sequence therefore holds each stream's share to
within a run, and the run at any position is found by descending the tree, so the mixture costs
time and memory per stream and per shard, never per sample.

With the chunked order (``chunk_size > 0``) the runs of each block of 64 are then put in a
seeded order: an even spread is periodic (A, B, A, B for two halves), and a period that divides
a unit's pieces would give every window of a worker stream the runs of one stream only, since
a window takes the same offset of every lane's unit. Each stretch of 64 runs still holds every
stream's share to within a run.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from shardstream.errors import ConfigError
from shardstream.streaming._planning.order import ChunkOrder, PlanOptions, epoch_sequence
from shardstream.streaming._planning.sequence import BaseSequence, Run, last_at_most

__all__ = ["MixedStream", "MixtureSequence", "stream_quotas"]

_BLOCK_RUNS = 64


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

    Examples:
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
class MixedStream:
    """One stream of a mixture, as planning sees it.

    Attributes:
        first_shard: Index of its first shard in the mixture's shard list.
        counts: Samples per shard of this stream.
        quota: Samples it gives per epoch.
        seed: Seed of its pass cycle's shard orders.
    """

    first_shard: int
    counts: np.ndarray
    quota: int
    seed: int


@dataclasses.dataclass(frozen=True)
class _Node:
    """A merge of two sides with ``left`` and ``right`` runs, spread evenly from ``offset``."""

    left: _Node | int  # a subtree, or a stream number
    right: _Node | int
    num_left: int
    num_right: int
    offset: int  # in [0, num_left + num_right)

    def side(self, slot: int) -> tuple[bool, int]:
        """Whether ``slot`` is on the left, and its number on that side."""
        total = self.num_left + self.num_right
        before = (slot * self.num_left + self.offset) // total
        after = ((slot + 1) * self.num_left + self.offset) // total
        return (True, before) if after > before else (False, slot - before)

    def slot_of(self, left: bool, number: int) -> int:
        """The slot of the ``number``-th run of one side."""
        total = self.num_left + self.num_right
        if left:
            return -(-((number + 1) * total - self.offset) // self.num_left) - 1
        return (number * total + self.offset) // self.num_right


class MixtureSequence(BaseSequence):
    """A mixture's epoch: every stream's window in runs, merged in exact proportion.

    Args:
        streams: The streams (quotas, shard counts, seeds).
        epoch: The epoch (selects each stream's window and the merge offsets).
        options: Seed, shuffle and ``piece_size`` (the run length).
    """

    def __init__(self, streams: Sequence[MixedStream], epoch: int, options: PlanOptions) -> None:
        self.streams = list(streams)
        self.epoch, self.options = epoch, options
        self.run_length = options.piece_size
        self.num_runs = [-(-stream.quota // self.run_length) for stream in self.streams]
        self.length = sum(stream.quota for stream in self.streams)
        rng = np.random.default_rng([options.seed, epoch, 0x3D1C])
        active = [s for s, runs in enumerate(self.num_runs) if runs > 0]
        if options.shuffle:
            active = [active[i] for i in rng.permutation(len(active))]
        self._root = self._build(active, rng if options.shuffle else None)
        self._cycles: dict[tuple[int, int], BaseSequence] = {}
        last = sorted(
            (self._slot_of(s, self.num_runs[s] - 1), self.run_length - self._run_size(s, -1))
            for s in active
        )
        self._last_slots = np.array([slot for slot, _ in last], dtype=np.int64)
        self._deficits = np.cumsum([0] + [short for _, short in last], dtype=np.int64)
        self._num_slots = sum(self.num_runs)
        self._blocks = (
            ChunkOrder.seeded(_BLOCK_RUNS, [options.seed, epoch, 0xB10C])
            if options.shuffle and options.chunk_size > 0
            else None
        )

    def _content(self, slot: int) -> int:
        """The slot whose run sits at ``slot``: shuffled within its block of full runs."""
        if self._blocks is None:
            return slot
        block, offset = divmod(slot, _BLOCK_RUNS)
        first = block * _BLOCK_RUNS
        if first + _BLOCK_RUNS > self._num_slots:
            return slot  # the last, partial block
        short = int(np.searchsorted(self._last_slots, first, side="left"))
        if short < len(self._last_slots) and self._last_slots[short] < first + _BLOCK_RUNS:
            return slot  # a block holding a stream's short last run keeps its positions
        return first + self._blocks.salted(block)(offset)

    def _build(self, streams: list[int], rng: np.random.Generator | None) -> _Node | int:
        if len(streams) == 1:
            return streams[0]
        half = len(streams) // 2
        left, right = self._build(streams[:half], rng), self._build(streams[half:], rng)
        num_left = sum(self.num_runs[s] for s in streams[:half])
        num_right = sum(self.num_runs[s] for s in streams[half:])
        total = num_left + num_right
        offset = int(rng.integers(total)) if rng is not None else total // 2
        return _Node(left, right, num_left, num_right, offset)

    def _run_size(self, stream: int, run: int) -> int:
        runs = self.num_runs[stream]
        run = run % runs
        return min(self.run_length, self.streams[stream].quota - run * self.run_length)

    def _slot_of(self, stream: int, run: int) -> int:
        """The slot of a stream's ``run``-th run (the tree walked from the leaf up)."""
        path: list[tuple[_Node, bool]] = []
        node = self._root
        while not isinstance(node, int):  # find the leaf's path (trees have few streams)
            in_left = stream in _leaves(node.left)
            path.append((node, in_left))
            node = node.left if in_left else node.right
        number = run
        for parent, in_left in reversed(path):
            number = parent.slot_of(in_left, number)
        return number

    def _stream_at(self, slot: int) -> tuple[int, int]:
        """``(stream, run number)`` of a slot."""
        node, number = self._root, slot
        while not isinstance(node, int):
            left, number = node.side(number)
            node = node.left if left else node.right
        return node, number

    def _slot_start(self, slot: int) -> int:
        shorter = int(np.searchsorted(self._last_slots, slot, side="left"))
        return slot * self.run_length - int(self._deficits[shorter])

    def _slot_at(self, position: int) -> int:
        """The slot holding mixture position ``position``."""
        low = position // self.run_length
        high = min(sum(self.num_runs) - 1, low + len(self.streams) + 1)
        return last_at_most(self._slot_start, position, low, high)

    def _cycle(self, stream: int, cycle: int) -> BaseSequence:
        key = (stream, cycle)
        found = self._cycles.get(key)  # one lookup: a thread loader's threads share the cache
        if found is None:
            if len(self._cycles) >= 64:
                self._cycles.clear()
            part = self.streams[stream]
            found = epoch_sequence(part.counts, part.seed, cycle, self.options)
            self._cycles[key] = found
        return found

    def _stream_runs(self, stream: int, start: int, stop: int, position: int) -> list[Run]:
        """Positions ``[start, stop)`` of a stream's endless cycle, as mixture runs."""
        part = self.streams[stream]
        size = int(part.counts.sum())
        runs: list[Run] = []
        while start < stop:
            cycle, offset = divmod(start, size)
            take = min(stop - start, size - offset)
            for run in self._cycle(stream, cycle).locate(offset, offset + take):
                shard = run.shard + part.first_shard
                runs.append(Run(shard, run.first, run.stop, position + run.position - offset))
            start, position = start + take, position + take
        return runs

    def locate(self, start: int, stop: int) -> list[Run]:
        """The runs holding mixture positions ``[start, stop)``, in order."""
        runs: list[Run] = []
        position = start
        while position < stop:
            slot = self._slot_at(position)
            stream, number = self._stream_at(self._content(slot))
            begin = self._slot_start(slot)
            end = min(stop, begin + self._run_size(stream, number))
            base = self.epoch * self.streams[stream].quota + number * self.run_length
            runs.extend(
                self._stream_runs(stream, base + position - begin, base + end - begin, position)
            )
            position = end
        return runs


def _leaves(node: _Node | int) -> set[int]:
    if isinstance(node, int):
        return {node}
    return _leaves(node.left) | _leaves(node.right)
