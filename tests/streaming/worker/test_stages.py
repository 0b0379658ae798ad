"""The stages that read shards without counts: every sample once, mixed, bounded memory."""

from __future__ import annotations

from shardstream.streaming.worker.draws import Draws
from shardstream.streaming.worker.interleave import Interleave
from shardstream.streaming.worker.shuffle import ShuffleBuffer

LENGTHS = [5, 3, 8, 1, 6, 4]


def _open(piece: int, start: int, stop: int):  # type: ignore[no-untyped-def]
    return iter([f"p{piece}-{i}" for i in range(start, stop)])


def _interleave(epoch: int) -> Interleave:
    return Interleave(LENGTHS, _open, num_open=3, seed=[7, epoch])


def test_interleave_yields_every_sample_once_in_piece_order_and_is_seeded() -> None:
    items = [sample for _, sample in _interleave(0)]
    assert sorted(items) == sorted(f"p{p}-{i}" for p, n in enumerate(LENGTHS) for i in range(n))
    for piece in range(len(LENGTHS)):
        own = [int(s.split("-")[1]) for s in items if s.startswith(f"p{piece}-")]
        assert own == sorted(own)
    assert items == [sample for _, sample in _interleave(0)]
    assert items != [sample for _, sample in _interleave(1)]


def test_unknown_lengths_end_with_their_streams() -> None:
    stage = Interleave([None, None], lambda p, a, b: iter(range(3 + p)), num_open=2, seed=[1])
    assert sorted(sample for _, sample in stage) == [0, 0, 1, 1, 2, 2, 3]


def test_shuffle_buffer_yields_each_sample_once() -> None:
    stage = ShuffleBuffer(_interleave(0), size=4, seed=[0])
    items = list(stage)
    assert sorted(s for _, s in items) == sorted(s for _, s in _interleave(0))
    assert items != list(_interleave(0))


def test_draws_are_uniform_and_seeded() -> None:
    draws = Draws([7, 1])
    values = [draws.below(10) for _ in range(5000)]
    counts = [values.count(digit) for digit in range(10)]
    assert min(counts) > 400 and max(counts) < 600  # uniform within sampling noise
    again = Draws([7, 1])
    assert [again.below(10) for _ in range(5000)] == values
