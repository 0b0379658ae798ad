"""The stages that read shards without counts: every sample once, mixed, bounded memory."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from shardstream.streaming._worker.pipeline import (
    Draws,
    in_batches,
    interleave_shards,
    shuffle_in_buffer,
)

LENGTHS = [5, 3, 8, 1, 6, 4, 0]


def _open(shard: int) -> Iterator[str]:
    return iter([f"s{shard}-{i}" for i in range(LENGTHS[shard])])


def _interleave(epoch: int, num_open: int = 3) -> list[str]:
    return list(interleave_shards(_open, len(LENGTHS), num_open=num_open, seed=[7, epoch]))


def test_interleave_yields_every_sample_once_in_shard_order_and_is_seeded() -> None:
    items = _interleave(0)
    assert sorted(items) == sorted(f"s{s}-{i}" for s, n in enumerate(LENGTHS) for i in range(n))
    for shard in range(len(LENGTHS)):
        own = [int(item.split("-")[1]) for item in items if item.startswith(f"s{shard}-")]
        assert own == sorted(own)
    assert items == _interleave(0)
    assert items != _interleave(1)


def _switches(items: list[str]) -> int:
    """How often the next sample comes from another shard."""
    shards = [item.split("-")[0] for item in items]
    return sum(a != b for a, b in itertools.pairwise(shards))


def test_interleave_draws_from_several_open_shards_at_once() -> None:
    one_at_a_time = sum(1 for n in LENGTHS if n) - 1
    assert _switches(_interleave(0, num_open=1)) == one_at_a_time
    assert _switches(_interleave(0)) > one_at_a_time


def test_without_shuffle_shards_are_read_in_order() -> None:
    items = list(interleave_shards(_open, len(LENGTHS), num_open=3, seed=[0], shuffle=False))
    assert items == [f"s{s}-{i}" for s, n in enumerate(LENGTHS) for i in range(n)]


def test_shuffle_buffer_yields_each_sample_once() -> None:
    items = list(shuffle_in_buffer(_interleave(0), size=4, seed=[0]))
    assert sorted(items) == sorted(_interleave(0))
    assert items != _interleave(0)
    assert list(shuffle_in_buffer(_interleave(0), size=1, seed=[0])) == _interleave(0)


def test_batches_are_consecutive_and_the_last_is_shorter() -> None:
    assert list(in_batches(iter(range(7)), 3)) == [[0, 1, 2], [3, 4, 5], [6]]


def test_draws_are_uniform_and_seeded() -> None:
    draws = Draws([7, 1])
    values = [draws.below(10) for _ in range(5000)]
    counts = [values.count(digit) for digit in range(10)]
    assert min(counts) > 400 and max(counts) < 600  # uniform within sampling noise
    again = Draws([7, 1])
    assert [again.below(10) for _ in range(5000)] == values
