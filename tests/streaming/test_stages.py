"""The stages for shards without counts pass the shared resume-conformance check."""

from __future__ import annotations

import itertools

from shardstream.streaming.planning.draws import Draws
from shardstream.streaming.planning.interleave import Interleave
from shardstream.streaming.planning.shuffle import ShuffleBuffer
from tests.streaming.conformance import assert_resumes

LENGTHS = [5, 3, 8, 1, 6, 4]


def _open(piece: int, start: int, stop: int):  # type: ignore[no-untyped-def]
    return iter([f"p{piece}-{i}" for i in range(start, stop)])


def _interleave(epoch: int) -> Interleave:
    return Interleave(LENGTHS, _open, num_open=3, seed=[7, epoch])


def test_interleave_conforms() -> None:
    assert_resumes(_interleave, num_points=6)


def test_shuffle_buffer_conforms() -> None:
    assert_resumes(
        lambda epoch: ShuffleBuffer(_interleave(epoch), size=4, seed=[7, epoch]), num_points=8
    )


def test_shuffle_buffer_yields_each_sample_once_and_bounds_memory() -> None:
    stage = ShuffleBuffer(_interleave(0), size=4, seed=[0])
    items = list(stage)
    assert sorted(s for _, s in items) == sorted(s for _, s in _interleave(0))
    assert items != list(_interleave(0))


def test_restored_buffer_rereads_only_buffered_samples() -> None:
    opened: list[tuple[int, int, int]] = []

    def counting_open(piece: int, start: int, stop: int):  # type: ignore[no-untyped-def]
        opened.append((piece, start, stop))
        return _open(piece, start, stop)

    stage = ShuffleBuffer(Interleave(LENGTHS, counting_open, 3, [1]), size=4, seed=[1])
    list(itertools.islice(iter(stage), 10))
    state = stage.state_dict()
    opened.clear()
    resumed = ShuffleBuffer(Interleave(LENGTHS, counting_open, 3, [1]), size=4, seed=[1])
    resumed.load_state_dict(state)
    next(iter(resumed))
    replayed = sum(stop - start for _, start, stop in opened[: len(state["buffer"])])
    assert replayed <= 4 * max(LENGTHS)


def test_draws_are_uniform_and_restore_mid_block() -> None:
    draws = Draws([7, 1])
    values = [draws.below(10) for _ in range(5000)]
    counts = [values.count(digit) for digit in range(10)]
    assert min(counts) > 400 and max(counts) < 600  # uniform within sampling noise
    for used in (0, 1, 1023, 1024, 1500):  # restores before, inside and at a block's edge
        original = Draws([3])
        for _ in range(used):
            original.below(100)
        restored = Draws([3])
        restored.load_state_dict(original.state_dict())
        assert [restored.below(n) for n in range(1, 2000)] == [
            original.below(n) for n in range(1, 2000)
        ]
