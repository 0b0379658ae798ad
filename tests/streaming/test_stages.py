"""Stateful stages pass the shared resume-conformance check; class mix on class-ordered data."""

from __future__ import annotations

import itertools

import numpy as np

from shardstream.streaming.planning.draws import Draws
from shardstream.streaming.planning.interleave import Interleave
from shardstream.streaming.planning.shuffle import ShuffleBuffer
from shardstream.streaming.planning.split import PlanOptions, plan_worker
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


def class_mix(labels: list[int], batch_size: int, num_classes: int) -> float:
    """Mean distinct classes per batch relative to uniform sampling with replacement."""
    batches = [
        labels[i : i + batch_size] for i in range(0, len(labels) - batch_size + 1, batch_size)
    ]
    uniform = num_classes * (1 - (1 - 1 / num_classes) ** batch_size)
    return float(np.mean([len(set(b)) for b in batches])) / uniform


def test_default_settings_mix_class_ordered_shards() -> None:
    num_samples, num_classes, per_shard, batch = 20_000, 100, 1000, 64
    counts = [per_shard] * (num_samples // per_shard)
    starts = list(itertools.accumulate(counts, initial=0))
    options = PlanOptions(batch_size=batch, block_size=64, piece_size=16)
    for workers in (1, 2):
        labels: list[int] = []
        for worker in range(workers):
            pieces = plan_worker(counts, 0, 0, 1, worker, workers, options)

            def open_piece(p: int, a: int, b: int, pieces=pieces):  # type: ignore[no-untyped-def]
                base = starts[pieces[p].shard] + pieces[p].start
                return iter(range(base + a, base + b))

            stage = ShuffleBuffer(
                Interleave([p.num_samples for p in pieces], open_piece, 32, [0, 0, 0, worker]),
                size=1000,
                seed=[0, 0, 0, worker],
            )
            labels += [index * num_classes // num_samples for _, index in stage]
        assert class_mix(labels, batch, num_classes) >= 0.8


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
