"""What one DataLoader worker runs for shards of unknown length (no manifest).

The worker's whole shards (:mod:`shardstream.streaming.planning.wholeshardplan`) are read
several at once, drawn at random (:class:`~.interleave.Interleave`) and shuffled through a
bounded buffer (:class:`~.shuffle.ShuffleBuffer`); batches are consecutive samples of that
stream. A resume
reads and drops the items already consumed (their lengths being unknown, there is no shortcut).
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Iterator
from typing import Any

from shardstream.storage.retry import retries_in_process
from shardstream.streaming.planning.wholeshardplan import WholeShardPlan
from shardstream.streaming.worker.interleave import Interleave
from shardstream.streaming.worker.pipeline import Batcher
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
    clock = batcher.clock
    retried = retries_in_process()  # retries of background reads count whenever they happen
    try:
        while True:
            started, before = time.perf_counter(), stats.bytes_read
            chunk = list(itertools.islice(samples, size))
            if not chunk:
                break
            if clock is not None:  # reading includes the interleave and the shuffle buffer
                clock.read_s += time.perf_counter() - started
                clock.bytes += stats.bytes_read - before
                now = retries_in_process()
                clock.retries += now - retried
                retried = now
            out = batcher.finish(chunk, stats)
            stats.batches += 1
            if clock is not None:
                clock.batches += 1
                clock.publish()
            yield from out
    finally:
        reader.close()
