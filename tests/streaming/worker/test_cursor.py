"""A stream cursor announces exactly the ranges it will open, wherever a slice starts."""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Sequence

import numpy as np
import pytest

from shardstream.streaming._planning.order import (
    DatasetFacts,
    PlanOptions,
    choose_order,
    epoch_sequence,
)
from shardstream.streaming._planning.split import Layout, PassPlan, Shape
from shardstream.streaming._planning.windows import StreamId
from shardstream.streaming._worker.cursor import StreamCursor

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


def _cursor(shared: bool = False) -> tuple[StreamCursor, RecordingReader, int]:
    options = PlanOptions(seed=0, chunk_size=REMOTE.chunk_size, num_open=REMOTE.num_open,
                          piece_size=REMOTE.piece_size, block_size=REMOTE.block_size)  # fmt: skip
    sequence = epoch_sequence(np.full(40, 1000), 0, 0, options)
    plan = PassPlan(sequence, Shape.of(sequence.length, Layout(1, 1, 64), options), options, 0, 0)
    reader = RecordingReader()
    cursor = StreamCursor(plan, StreamId(0, 0, 0, 0), reader, shared)  # type: ignore[arg-type]
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
    reader.prefetch = lambda pieces, group: (
        calls.append(len(pieces))
        or real_prefetch(  # type: ignore[method-assign]
            pieces, group
        )
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


def _turns(shared: StreamCursor, own: StreamCursor, first: int, steps: int) -> list[object]:
    """Samples of ``steps`` steps of 64 from ``first``, the two cursors taking turns (as
    workers do at an epoch's end)."""
    got: list[object] = []
    for step in range(steps):
        cursor = (shared, own)[step % 2]
        start = first + 64 * step
        got += list(cursor.read(start, start + 64))
    return got


def test_turns_at_a_shared_stream_move_open_runs_forward_instead_of_opening_them_again() -> None:
    reference, _, _ = _cursor()
    expected = list(reference.read(0, 64 * 40))
    own, own_reader, _ = _cursor()
    shared, shared_reader, _ = _cursor(shared=True)
    got = list(own.read(0, 64 * 20)) + _turns(shared, own, 64 * 20, 20)
    assert got == expected, "every position read once, by one cursor or the other"
    own_runs = {(shard, stop) for shard, _, stop in own_reader.opened}
    shared_runs = {(shard, stop) for shard, _, stop in shared_reader.opened}
    assert len(own_reader.opened) == len(own_runs), "a run the other cursor read in is reopened"
    assert len(shared_reader.opened) == len(shared_runs)


def test_a_shared_stream_announces_only_what_its_slice_opens() -> None:
    own, _, _ = _cursor()
    shared, reader, _ = _cursor(shared=True)
    list(own.read(0, 64 * 20))
    for step in range(20, 40, 2):  # the other steps are another worker's
        before = len(reader.opened)
        list(shared.read(64 * step, 64 * (step + 1)))
        opened = set(reader.opened[before:])
        assert set(reader.announced) == opened, "ranges announced past the slice are wasted"


def test_a_worker_shares_only_the_streams_it_meets_after_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two workers, two streams of unequal length: each reads its own stream front to back,
    and the longer stream's last steps, which both serve, are a shared cursor's."""
    from shardstream.streaming._worker import pipeline

    made: list[tuple[int, bool]] = []

    class Recorded(StreamCursor):
        def __init__(self, plan, stream, reader, shared=False):  # type: ignore[no-untyped-def]
            made.append((stream.phase, shared))
            super().__init__(plan, stream, reader, shared)

    monkeypatch.setattr(pipeline, "StreamCursor", Recorded)
    options = PlanOptions(seed=0, chunk_size=2 * 640, num_open=8, piece_size=640, block_size=640)
    sequence = epoch_sequence(np.full(11, 1000), 0, 0, options)
    plan = PassPlan(sequence, Shape.of(sequence.length, Layout(1, 2, 64), options), options, 0, 0)
    assert plan.shape.stream_batches.tolist() == [90, 82]  # 8 steps at the end: stream 0's
    read = []
    for worker in (0, 1):
        job = pipeline.StepJob(plan, range(1), worker, 2)
        for samples in pipeline._step_samples(job, RecordingReader(), pipeline.WorkerStats()):  # type: ignore[arg-type]
            read += samples
    assert sorted(read) == sorted(set(read)) and len(read) == 11_000
    assert made == [(0, False), (1, False), (0, True)]
