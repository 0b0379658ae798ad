"""Which samples each batch of a pass holds, from the plan alone (no I/O, no processes).

The loader reads exactly this order (the tests compare it with real DataLoader workers), so it
is what ``shardstream bench --shuffle`` and the shuffle-quality benchmark measure: how mixed
the batches are, computed in milliseconds per thousand batches without reading a byte.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from shardstream.streaming.planning.schedule import PassPlan
from shardstream.streaming.planning.windows import StreamId, StreamLanes, build_window

__all__ = ["planned_batches", "stream_samples"]


Refs = tuple[np.ndarray, np.ndarray]  # (shard numbers, sample ordinals within the shards)


def stream_samples(plan: PassPlan, rank: int, phase: int) -> Iterator[Refs]:
    """``(shards, ordinals)`` of one stream's samples, window by window, in reading order."""
    stream = StreamId(plan.epoch, plan.pass_index, rank, phase)
    lanes = StreamLanes(plan.shape, phase)
    index = 0
    while lanes.before(index) < lanes.total:
        window = build_window(plan.sequence, plan.shape, plan.options, stream, index)
        shards = np.fromiter((run.shard for run in window.runs), np.int64, len(window.runs))
        firsts = np.fromiter((run.first for run in window.runs), np.int64, len(window.runs))
        yield shards[window.labels], firsts[window.labels] + window.ordinals
        index += 1


def planned_batches(plan: PassPlan, rank: int) -> Iterator[Refs]:
    """``(shards, ordinals)`` of every batch plan rank ``rank`` yields in the pass, in order.

    Examples:
        >>> from shardstream.streaming.planning.order import PlanOptions, epoch_sequence
        >>> from shardstream.streaming.planning.split import Layout, Shape
        >>> options = PlanOptions(block_size=4, piece_size=2, num_open=4, chunk_size=2)
        >>> sequence = epoch_sequence(np.array([8, 8]), 0, 0, options)
        >>> plan = PassPlan(sequence, Shape.of(16, Layout(1, 2, 4), options), options, 0, 0)
        >>> sum(len(shards) for shards, _ in planned_batches(plan, 0))
        16
    """
    shape, batch = plan.shape, plan.shape.layout.batch_size
    streams = [stream_samples(plan, rank, phase) for phase in range(shape.layout.num_workers)]
    pending: list[list[Refs]] = [[] for _ in streams]
    for step in range(shape.steps):
        phase, micro = shape.step(step)
        wanted = min(batch, int(shape.stream_samples[phase]) - micro * batch)
        yield _take(streams[phase], pending[phase], wanted)


def _take(source: Iterator[Refs], pending: list[Refs], count: int) -> Refs:
    """The next ``count`` samples of a stream (``pending`` holds what was read but not taken)."""
    have = sum(len(shards) for shards, _ in pending)
    while have < count:
        shards, ordinals = next(source)
        pending.append((shards, ordinals))
        have += len(shards)
    shards = np.concatenate([part for part, _ in pending])
    ordinals = np.concatenate([part for _, part in pending])
    pending[:] = [(shards[count:], ordinals[count:])] if len(shards) > count else []
    return shards[:count], ordinals[:count]
