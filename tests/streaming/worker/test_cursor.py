"""A stream cursor announces exactly the ranges it will open, wherever a slice starts."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import numpy as np
import pytest

from shardstream.streaming.planning.order import (
    DatasetFacts,
    PlanOptions,
    choose_order,
    epoch_sequence,
)
from shardstream.streaming.planning.schedule import PassPlan
from shardstream.streaming.planning.split import Layout, Shape
from shardstream.streaming.planning.windows import StreamId
from shardstream.streaming.worker.cursor import StreamCursor

REMOTE = choose_order(DatasetFacts(indexed=True, local=False, mean_sample_bytes=10_000))


class RecordingReader:
    """Runs of ``(shard, ordinal)`` samples; records what is announced and what is opened."""

    announces = True

    def __init__(self) -> None:
        self.announced: list[tuple[int, int, int]] = []
        self.opened: list[tuple[int, int, int]] = []

    def prefetch(self, pieces: Sequence[tuple[int, int, int]], group: Hashable) -> None:
        self.announced = list(pieces)  # a group's announcement replaces its earlier one

    def open(self, shard: int, first: int, stop: int) -> Iterator[tuple[int, int]]:
        self.opened.append((shard, first, stop))
        return iter([(shard, ordinal) for ordinal in range(first, stop)])

    def forget(self, group: Hashable) -> None:
        self.announced = []


def _cursor() -> tuple[StreamCursor, RecordingReader, int]:
    options = PlanOptions(seed=0, chunk_size=REMOTE.chunk_size, num_open=REMOTE.num_open,
                          piece_size=REMOTE.piece_size, block_size=REMOTE.block_size)  # fmt: skip
    sequence = epoch_sequence(np.full(40, 1000), 0, 0, options)
    plan = PassPlan(sequence, Shape.of(sequence.length, Layout(1, 1, 64), options), options, 0, 0)
    reader = RecordingReader()
    cursor = StreamCursor(plan, StreamId(0, 0, 0, 0), reader)  # type: ignore[arg-type]
    return cursor, reader, REMOTE.num_open * REMOTE.piece_size


@pytest.mark.parametrize("start", [0, 1, 777, 5000])
def test_every_open_was_announced_wherever_a_slice_starts(start: int) -> None:
    cursor, reader, window = _cursor()
    announced_before_open: list[set[tuple[int, int, int]]] = []
    real_open = reader.open

    def open_and_check(shard: int, first: int, stop: int) -> Iterator[tuple[int, int]]:
        announced_before_open.append(set(reader.announced))
        return real_open(shard, first, stop)

    reader.open = open_and_check  # type: ignore[method-assign]
    got = list(cursor.read(start, start + 300))
    got += list(cursor.read(start + 2000, start + 2100))  # another jump, same window
    assert len(got) == 400 and len(set(got)) == 400
    assert len(reader.opened) == len(announced_before_open) > 0
    missed = [o for o, known in zip(reader.opened, announced_before_open, strict=True)
              if o not in known]  # fmt: skip
    assert missed == [], "a run opened that was never announced waits for a first byte"
    assert start + 2100 < window  # the jumps stay in the first window


def test_a_contiguous_read_announces_once_per_window() -> None:
    cursor, reader, _ = _cursor()
    calls = []
    real_prefetch = reader.prefetch
    reader.prefetch = lambda pieces, group: calls.append(len(pieces)) or real_prefetch(  # type: ignore[method-assign]
        pieces, group
    )
    for step in range(20):
        list(cursor.read(step * 64, (step + 1) * 64))
    assert len(calls) == 1, "reading on from where the last slice ended announces nothing more"


def test_local_shards_announce_nothing() -> None:
    cursor, reader, _ = _cursor()
    reader.announces = False
    calls = []
    reader.prefetch = lambda pieces, group: calls.append(pieces)  # type: ignore[method-assign]
    assert len(list(cursor.read(100, 400))) == 300
    assert calls == [] and reader.opened
