"""Epoch planning, checked against brute force on integers: no torch, no I/O, no processes.

Every sample is identified by its position in the epoch's sequence. For many random layouts
the tests read every stream of every rank window by window and check that the plan covers the
epoch exactly (pad/drop), that ranks are equal, that steps cover every stream once, and that
what a pass leaves after any number of steps is exactly what it did not read.
"""

from __future__ import annotations

import collections
import random

import numpy as np
import pytest

from shardstream.errors import ConfigError
from shardstream.streaming._planning.leftover import PassRecord, pass_sequence, remainder
from shardstream.streaming._planning.order import PlanOptions
from shardstream.streaming._planning.sequence import (
    DerivedSequence,
    ShardSequence,
    shard_order,
)
from shardstream.streaming._planning.split import (
    Layout,
    Shape,
    plan_ranks,
    samples_per_rank,
    steps_of_worker,
)
from shardstream.streaming._planning.windows import StreamId, StreamLanes, build_window


def _stream_positions(sequence, shape, options, rank, phase, epoch=0, pass_index=0):  # type: ignore[no-untyped-def]
    """Base positions of one stream, in its output order, read window by window."""
    lanes = StreamLanes(shape, phase)
    positions: list[int] = []
    index = 0
    while len(positions) < lanes.total:
        window = build_window(
            sequence, shape, options, StreamId(epoch, pass_index, rank, phase), index
        )
        assert window.start == len(positions)
        for label, ordinal in zip(window.labels.tolist(), window.ordinals.tolist(), strict=True):
            positions.append(window.runs[label].position + ordinal)
        index += 1
    assert len(positions) == lanes.total == int(shape.stream_samples[phase])
    return positions


def _random_case(rng: random.Random):  # type: ignore[no-untyped-def]
    counts = np.array([rng.randint(0, 9) for _ in range(rng.randint(1, 12))], dtype=np.int64)
    counts[0] = max(counts[0], 1)
    options = PlanOptions(
        seed=rng.randrange(5), shuffle=rng.random() < 0.8, policy=rng.choice(["pad", "drop"]),
        block_size=rng.choice([1, 2, 4, 8]), piece_size=rng.choice([1, 2, 3, 4]),
        num_open=rng.choice([1, 2, 3, 5]),
    )  # fmt: skip
    layout = Layout(rng.randint(1, 4), rng.randint(1, 4), rng.choice([1, 2, 3]))
    base = ShardSequence(counts, shard_order(len(counts), options.seed, 1, options.shuffle))
    return base, options, layout


def test_streams_cover_each_rank_part_exactly() -> None:
    rng = random.Random(0)
    for _ in range(300):
        base, options, layout = _random_case(rng)
        shape = Shape.of(base.length, layout, options)
        seen: collections.Counter[int] = collections.Counter()
        for rank in range(layout.world_size):
            part: list[int] = []
            for phase in range(layout.num_workers):
                part += _stream_positions(base, shape, options, rank, phase)
            expected = [(rank * shape.per_rank + i) % base.length for i in range(shape.per_rank)]
            assert sorted(part) == sorted(expected)
            seen.update(part)
        if options.policy == "pad":
            assert set(seen) == set(range(base.length))
            assert sum(seen.values()) - base.length < layout.world_size
        else:
            assert max(seen.values(), default=1) == 1
            assert base.length - len(seen) < layout.world_size


def test_steps_deal_every_stream_slice_once_to_the_workers_in_turn() -> None:
    rng = random.Random(1)
    for _ in range(200):
        base, options, layout = _random_case(rng)
        shape = Shape.of(base.length, layout, options)
        for num_workers in {1, 2, layout.num_workers}:
            start = rng.randrange(shape.steps + 1)
            seen: dict[int, list] = {}
            for worker in range(num_workers):
                for step, reads in steps_of_worker(shape, start, worker, num_workers, range(1)):
                    assert (step - start) % num_workers == worker
                    seen[step] = [(r.phase, r.start, r.stop) for r in reads]
            assert sorted(seen) == list(range(start, shape.steps))
        covered = collections.Counter()
        for step in range(shape.steps):
            phase, micro = shape.step(step)
            stop = min((micro + 1) * layout.batch_size, int(shape.stream_samples[phase]))
            covered.update((phase, i) for i in range(micro * layout.batch_size, stop))
        assert sum(covered.values()) == len(covered) == shape.per_rank
        full = [shape.step(t)[0] for t in range(shape.steps)]
        short = [
            p for p in range(layout.num_workers) if shape.stream_samples[p] % layout.batch_size
        ]
        assert len(short) <= 1, "only the stream with the part's last unit ends short"
        assert shape.steps == -(-shape.per_rank // layout.batch_size) and len(full) == shape.steps


def _consumed(sequence, shape, options, steps, epoch=0, pass_index=0):  # type: ignore[no-untyped-def]
    taken = shape.consumed_samples(steps)
    positions: list[int] = []
    for rank in range(shape.layout.world_size):
        for phase in range(shape.layout.num_workers):
            order = _stream_positions(sequence, shape, options, rank, phase, epoch, pass_index)
            positions += order[: int(taken[phase])]
    return positions


def _slots(sequence, shape) -> list[int]:  # type: ignore[no-untyped-def]
    """Every read slot of a pass as base positions: ranks' parts (with pad) and drop's tail."""
    world = shape.layout.world_size
    slots = [(i % sequence.length) for i in range(world * shape.per_rank)]
    slots += list(range(world * shape.per_rank, sequence.length))
    if isinstance(sequence, DerivedSequence):
        flat = _positions(sequence)
        slots = [flat[i] for i in slots]
    return slots


def test_what_a_pass_leaves_is_exactly_what_it_did_not_read() -> None:
    rng = random.Random(2)
    for _ in range(200):
        base, options, layout = _random_case(rng)
        sequence = base
        for pass_index in range(2):  # a restart, then a second one in the same epoch
            shape = Shape.of(sequence.length, layout, options)
            steps = rng.randrange(shape.steps + 1)
            read = _consumed(sequence, shape, options, steps, 1, pass_index)
            left = remainder(sequence, PassRecord(layout, steps), 1, pass_index, options)
            assert collections.Counter(read) + collections.Counter(
                _positions(left)
            ) == collections.Counter(_slots(sequence, shape))
            assert left.base is base
            if left.length == 0:
                break
            sequence = left
            layout = Layout(rng.randint(1, 4), rng.randint(1, 4), rng.choice([1, 2, 3]))


def _positions(sequence: DerivedSequence) -> list[int]:
    """Every base position of a pass's sequence, in order."""
    return [p for a, b in sequence.base_ranges(0, sequence.length) for p in range(a, b)]


def test_remainder_costs_streams_and_lanes_not_samples() -> None:
    counts = np.full(2000, 1000, dtype=np.int64)  # two million samples
    base = ShardSequence(counts, shard_order(len(counts), 0, 0))
    options = PlanOptions()
    layout = Layout(16, 4, 64)
    shape = Shape.of(base.length, layout, options)
    left = remainder(base, PassRecord(layout, shape.steps // 2), 0, 0, options)
    assert abs(left.length - base.length // 2) < layout.world_size * layout.batch_size * 4
    assert len(left.template.streams) <= shape.lanes * (1 + 2 * layout.num_workers)
    again = pass_sequence(base, 0, [PassRecord(layout, shape.steps // 2)], options)
    assert again.base_ranges(0, again.length) == left.base_ranges(0, left.length)


def class_mix(labels: list[int], batch_size: int, num_classes: int) -> float:
    """Mean distinct classes per batch relative to uniform sampling with replacement."""
    batches = [
        labels[i : i + batch_size] for i in range(0, len(labels) - batch_size + 1, batch_size)
    ]
    uniform = num_classes * (1 - (1 - 1 / num_classes) ** batch_size)
    return float(np.mean([len(set(b)) for b in batches])) / uniform


@pytest.mark.parametrize("workers", [1, 2])
def test_default_windows_mix_class_ordered_shards(workers: int) -> None:
    num_samples, num_classes, per_shard, batch = 20_000, 100, 1000, 64
    counts = np.full(num_samples // per_shard, per_shard, dtype=np.int64)
    base = ShardSequence(counts, shard_order(len(counts), 0, 0))
    options = PlanOptions()  # the defaults: 64 lanes of 64-sample pieces
    shape = Shape.of(base.length, Layout(1, workers, batch), options)
    labels: list[int] = []
    for phase in range(workers):  # a class is 200 consecutive samples of one shard
        labels += [
            p * num_classes // num_samples
            for p in _stream_positions(base, shape, options, 0, phase)
        ]
    assert class_mix(labels, batch, num_classes) >= 0.8


def test_shard_orders_stay_those_of_earlier_releases() -> None:
    for num_shards in (1, 7, 1000, 100_003):
        order = shard_order(num_shards, 3, 2)
        expected = np.random.default_rng([3, 2, 0x5EED]).permutation(num_shards)
        assert order.dtype == np.int32 and np.array_equal(order, expected)


def test_canonical_ranks_split_into_physical_ranks() -> None:
    assert list(plan_ranks(8, 2, 1)) == [4, 5, 6, 7]
    with pytest.raises(ConfigError, match="divide"):
        plan_ranks(8, 3, 0)


def test_shard_order_is_seeded_and_changes_with_epoch() -> None:
    assert np.array_equal(shard_order(50, 0, 1), shard_order(50, 0, 1))
    assert not np.array_equal(shard_order(50, 0, 1), shard_order(50, 0, 2))
    assert shard_order(5, 0, 1, shuffle=False).tolist() == [0, 1, 2, 3, 4]
    assert samples_per_rank(10, 3, "pad") == 4 and samples_per_rank(10, 3, "drop") == 3


def test_bad_options_raise() -> None:
    with pytest.raises(ConfigError, match="policy"):
        PlanOptions(policy="repeat")
    with pytest.raises(ConfigError, match="piece_size"):
        PlanOptions(piece_size=0)
    with pytest.raises(ConfigError, match="positive"):
        Layout(0, 1, 1)
