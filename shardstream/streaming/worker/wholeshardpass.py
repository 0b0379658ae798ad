"""What one DataLoader worker runs for shards of unknown length (no manifest).

The worker's whole shards (:mod:`shardstream.streaming.planning.wholeshardplan`) are read
several at once, drawn at random (:class:`~.interleave.Interleave`) and shuffled through a
bounded buffer (:class:`~.shuffle.ShuffleBuffer`); batches are consecutive samples of that
stream, handed to the worker's one timed loop (:func:`~.pipeline.run_batches`). A resume reads
and drops the items already consumed (their lengths being unknown, there is no shortcut).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Generator, Iterator
from typing import Any

from shardstream.streaming.planning.wholeshardplan import WholeShardPlan
from shardstream.streaming.worker.interleave import Interleave
from shardstream.streaming.worker.pipeline import Batcher, run_batches
from shardstream.streaming.worker.reader import ShardReader, WorkerStats
from shardstream.streaming.worker.shuffle import ShuffleBuffer

__all__ = ["run_whole_shards"]


def run_whole_shards(
    plan: WholeShardPlan,
    reader: ShardReader,
    batcher: Batcher,
    stats: WorkerStats,
    num_open: int,
    shuffle_buffer: int,
    shuffle: bool,
) -> Iterator[Any]:
    """Yield this worker's batches (or samples) of its whole shards, after ``skip_items``."""

    def open_shard(number: int, start: int, stop: int) -> Iterator[Any]:
        return reader.open(plan.shards[number], start, None)

    source = Interleave([None] * len(plan.shards), open_shard, num_open, plan.seed, shuffle)
    stages = ShuffleBuffer(source, shuffle_buffer if shuffle else 1, plan.seed)
    samples: Iterator[Any] = map(operator.itemgetter(1), stages)
    size = batcher.batch_size or 1
    if plan.skip_items:  # read and dropped, not decoded
        samples = itertools.islice(samples, plan.skip_items * size, None)
    # The batches' reading time includes the interleave and the shuffle buffer.
    return run_batches(_chunks(samples, size), reader, batcher, stats)


def _chunks(samples: Iterator[Any], size: int) -> Generator[list[Any], None, None]:
    """Consecutive lists of ``size`` samples (the last one shorter), until ``samples`` ends."""
    while chunk := list(itertools.islice(samples, size)):
        yield chunk
