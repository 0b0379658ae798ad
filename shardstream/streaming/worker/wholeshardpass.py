"""What one DataLoader worker runs for shards of unknown length (no manifest): its whole
shards, several open at once, through a bounded shuffle buffer, in batches.

Each stage is a generator function: :func:`interleave_shards` -> :func:`shuffle_in_buffer` ->
:func:`in_batches`, fed to the worker's one timed loop (:func:`~.pipeline.run_batches`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from shardstream.streaming.planning.wholeshardplan import WholeShardPlan
from shardstream.streaming.worker.pipeline import Batcher, run_batches
from shardstream.streaming.worker.reader import ShardReader, WorkerStats

__all__ = ["Draws", "in_batches", "interleave_shards", "run_whole_shards", "shuffle_in_buffer"]

_END = object()
#: Uniform floats drawn per numpy call (a call per draw would cost microseconds per sample).
_DRAWS_PER_CALL = 1024


def run_whole_shards(
    plan: WholeShardPlan,
    reader: ShardReader,
    batcher: Batcher,
    stats: WorkerStats,
    num_open: int,
    shuffle_buffer: int,
    shuffle: bool,
) -> Iterator[Any]:
    """Yield this worker's batches (or samples) of its whole shards, after ``skip_items``.

    A resume reads and drops the items already consumed: their shards' lengths are unknown,
    so there is no shortcut. The batches' reading time includes the interleave and the buffer.
    """

    def open_shard(number: int) -> Iterator[Any]:
        return reader.open(plan.shards[number], 0, None)

    samples = interleave_shards(open_shard, len(plan.shards), num_open, plan.seed, shuffle)
    samples = shuffle_in_buffer(samples, shuffle_buffer if shuffle else 1, plan.seed)
    size = batcher.batch_size or 1
    if plan.skip_items:  # read and dropped, not decoded
        samples = itertools.islice(samples, plan.skip_items * size, None)
    return run_batches(in_batches(samples, size), reader, batcher, stats)


def interleave_shards(
    open_shard: Callable[[int], Iterator[Any]],
    num_shards: int,
    num_open: int,
    seed: Sequence[int],
    shuffle: bool = True,
) -> Iterator[Any]:
    """Stage: every sample of shards ``0..num_shards-1``, each next one from a random open shard.

    A single stream through a shard written in class order yields one class for a long time,
    and a shuffle buffer mixes only what it holds; ``num_open`` shards open at once put up to
    ``num_open`` classes in flight, with memory bounded by ``num_open`` open streams. Shards are
    opened in a seeded order; a shard ends when its stream does.

    Args:
        open_shard: ``open_shard(number)`` yields the samples of shard ``number``.
        num_shards: Shards to read.
        num_open: Shards read at the same time (1 reads them one after another).
        seed: Seed sequence for the opening order and the draws, e.g. ``[seed, epoch, rank,
            worker]``.
        shuffle: Open shards in a seeded order and draw among them; with False, in order, one
            at a time.

    Examples:
        >>> sorted(interleave_shards(lambda n: iter([n, n]), 2, num_open=2, seed=[0]))
        [0, 0, 1, 1]
    """
    num_open = max(1, num_open) if shuffle else 1
    order = (
        np.random.default_rng([*seed, 1]).permutation(num_shards).tolist()
        if shuffle
        else list(range(num_shards))
    )
    below = Draws([*seed, 2]).below
    streams: list[Iterator[Any]] = []
    following = 0  # the next shard of ``order`` to open
    try:
        while True:
            while len(streams) < num_open and following < len(order):
                streams.append(open_shard(order[following]))
                following += 1
            if not streams:
                return
            pick = below(len(streams)) if len(streams) > 1 else 0
            sample = next(streams[pick], _END)
            if sample is _END:
                _close(streams.pop(pick))
                continue
            yield sample
    finally:
        for stream in streams:
            _close(stream)


def shuffle_in_buffer(samples: Iterable[Any], size: int, seed: Sequence[int]) -> Iterator[Any]:
    """Stage: ``samples`` shuffled through a buffer of ``size`` (0 or 1: in order).

    Memory is bounded by ``size`` samples (the encoded bytes, before decoding).

    Examples:
        >>> sorted(shuffle_in_buffer(range(4), size=2, seed=[0]))
        [0, 1, 2, 3]
    """
    buffer: list[Any] = []
    size, below = max(1, size), Draws([*seed, 3]).below
    for item in samples:
        if len(buffer) < size:
            buffer.append(item)
            continue
        pick = below(size)
        out, buffer[pick] = buffer[pick], item
        yield out
    while buffer:
        pick = below(len(buffer))
        buffer[pick], buffer[-1] = buffer[-1], buffer[pick]
        yield buffer.pop()


def in_batches(samples: Iterator[Any], size: int) -> Generator[list[Any], None, None]:
    """Stage: consecutive lists of ``size`` samples (the last one shorter) until ``samples``
    ends."""
    while batch := list(itertools.islice(samples, size)):
        yield batch


class Draws:
    """Seeded uniform draws in ``[0, n)``, cheap enough to make one per sample: one numpy call
    per block of floats, each turned into ``int(u * n)`` (a bias below 1e-9 for any ``n`` a
    shuffle uses).

    Examples:
        >>> draws = Draws([0, 1])
        >>> all(0 <= draws.below(10) < 10 for _ in range(5))
        True
    """

    def __init__(self, seed: Sequence[int]) -> None:
        self._rng = np.random.default_rng(list(seed))
        self._block: list[float] = []
        self._used = 0

    def below(self, n: int) -> int:
        """One draw in ``[0, n)``."""
        if self._used == len(self._block):
            self._block = self._rng.random(_DRAWS_PER_CALL).tolist()
            self._used = 0
        value = self._block[self._used]
        self._used += 1
        return int(value * n)


def _close(stream: Iterator[Any]) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        close()
