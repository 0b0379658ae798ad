"""Epoch plans: equal per-rank counts, coverage under pad/drop, worker structure."""

from __future__ import annotations

import collections
import itertools
import random

import pytest

from shardstream.errors import ConfigError
from shardstream.streaming.planning.split import (
    PlanOptions,
    batches_consumed_per_worker,
    next_worker,
    plan_worker,
    samples_per_rank,
    shard_order,
    worker_batch_counts,
    worker_sample_counts,
)


def _samples(counts, epoch, rank, world, worker, workers, options):
    return [
        (piece.shard, index)
        for piece in plan_worker(counts, epoch, rank, world, worker, workers, options)
        for index in range(piece.start, piece.stop)
    ]


@pytest.mark.parametrize("policy", ["pad", "drop"])
@pytest.mark.parametrize("batch_size", [1, 3])
def test_plans_are_exact_for_every_layout(policy: str, batch_size: int) -> None:
    rng = random.Random(0)
    for num_shards, world, workers in itertools.product(range(1, 8), range(1, 4), range(1, 5)):
        counts = [rng.randint(0 if num_shards > 1 else 1, 9) for _ in range(num_shards)]
        if sum(counts) == 0:
            counts[0] = 1
        options = PlanOptions(seed=3, policy=policy, batch_size=batch_size, piece_size=2)
        total = sum(counts)
        per_rank = samples_per_rank(total, world, policy)
        seen: collections.Counter[tuple[int, int]] = collections.Counter()
        for rank in range(world):
            expected = worker_sample_counts(per_rank, workers, options)
            for worker in range(workers):
                got = _samples(counts, 1, rank, world, worker, workers, options)
                assert len(got) == expected[worker]
                seen.update(got)
            assert sum(expected) == per_rank
        universe = {(s, i) for s, c in enumerate(counts) for i in range(c)}
        assert set(seen) <= universe
        if policy == "pad":
            assert set(seen) == universe
            assert sum(seen.values()) - total < world
            assert max(seen.values()) <= 1 + -(-world // total)
        else:
            assert max(seen.values()) == 1 if per_rank else True
            assert total - len(seen) < world


def test_only_one_short_batch_per_rank_and_no_empty_worker_when_avoidable() -> None:
    options = PlanOptions(batch_size=4, block_size=8)
    counts = worker_sample_counts(50, 3, options)
    assert sum(counts) == 50 and min(counts) > 0
    assert sum(count % 4 != 0 for count in counts) == 1
    assert min(worker_sample_counts(5, 4, PlanOptions())) > 0  # split inside shards


def test_shard_order_changes_with_epoch_and_is_shared() -> None:
    assert shard_order(50, 0, 1) == shard_order(50, 0, 1)
    assert shard_order(50, 0, 1) != shard_order(50, 0, 2)
    assert shard_order(5, 0, 1, shuffle=False) == [0, 1, 2, 3, 4]


def test_ranks_rotate_over_shards_between_epochs() -> None:
    counts = [10] * 8
    options = PlanOptions(seed=0)
    shards = [{p.shard for p in plan_worker(counts, e, 0, 4, 0, 1, options)} for e in range(4)]
    assert len(set(map(frozenset, shards))) > 1


def test_round_robin_consumption_matches_dataloader_order() -> None:
    counts = [3, 1, 2]
    order = []
    taken = [0, 0, 0]
    while any(t < c for t, c in zip(taken, counts, strict=True)):
        for worker in range(3):
            if taken[worker] < counts[worker]:
                taken[worker] += 1
                order.append(worker)
    for consumed in range(len(order) + 1):
        expected = [order[:consumed].count(w) for w in range(3)]
        assert batches_consumed_per_worker(counts, consumed) == expected
        if consumed < len(order):
            assert next_worker(counts, consumed) == order[consumed] or (
                counts[next_worker(counts, consumed)] == expected[next_worker(counts, consumed)]
            )


def test_batch_counts_equal_across_ranks() -> None:
    options = PlanOptions(batch_size=5)
    per_rank = samples_per_rank(103, 3)
    assert sum(worker_batch_counts(per_rank, 2, options)) == -(-per_rank // 5)


def test_bad_options_raise() -> None:
    with pytest.raises(ConfigError, match="policy"):
        PlanOptions(policy="repeat")
    with pytest.raises(ConfigError, match="out of range"):
        plan_worker([3], 0, 2, 2, 0, 1, PlanOptions())
