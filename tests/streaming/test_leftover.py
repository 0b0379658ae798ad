"""What a pass leaves, computed where it is read: the same ranges as before, at a cost per rank.

The planning tests check against brute force on integers (no torch, no I/O): every sample is
its position in the epoch's sequence. Elastic restores are checked for random layouts up to 64
ranks x 8 workers, in planning and through simulated ranks' loaders (``StreamOptions(rank,
world_size)`` in one process, the code path torch.distributed ranks take).
"""

from __future__ import annotations

import collections
import pathlib
import random

import numpy as np
import pytest

from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from shardstream.streaming._planning import leftover
from shardstream.streaming._planning.leftover import PassRecord, pass_sequence, remainder
from shardstream.streaming._planning.order import PlanOptions, epoch_sequence
from shardstream.streaming._planning.split import Layout, Shape
from shardstream.streaming._planning.windows import StreamId, build_window
from tests.streaming.eager_remainder import clipped, eager_remainder
from tests.streaming.shards import keys_of, make_dataset
from tests.streaming.test_planning import _stream_positions


def _options(rng: random.Random, policy: str | None = None) -> PlanOptions:
    return PlanOptions(
        seed=rng.randrange(5), shuffle=rng.random() < 0.8,
        policy=policy or rng.choice(["pad", "drop"]), block_size=rng.choice([1, 2, 4, 8]),
        piece_size=rng.choice([1, 2, 3, 4]), num_open=rng.choice([1, 2, 3, 5, 8]),
        chunk_size=rng.choice([0, 1, 3, 4]),
    )  # fmt: skip


def test_left_sequences_keep_the_ranges_of_the_stored_remainder() -> None:
    """Range for range the order of the list earlier releases stored: saved states continue."""
    rng = random.Random(7)
    for case in range(150):
        counts = np.array([rng.randint(0, 30) for _ in range(rng.randint(1, 30))])
        counts[0] = max(counts[0], 1)
        options = _options(rng)
        base = epoch_sequence(counts, options.seed, 1, options)
        sequence = base
        for pass_index in range(3):  # chains: a restart of a restart
            layout = Layout(rng.randint(1, 6), rng.randint(1, 5), rng.choice([1, 2, 3]))
            shape = Shape.of(sequence.length, layout, options)
            record = PassRecord(layout, rng.randrange(shape.steps + 1))
            stored = eager_remainder(sequence, record, 1, pass_index, options)
            left = remainder(sequence, record, 1, pass_index, options)
            assert left.base_ranges(0, left.length) == stored, case
            for _ in range(4):
                start = rng.randrange(left.length + 1)
                stop = rng.randrange(start, left.length + 1)
                assert left.base_ranges(start, stop) == clipped(stored, start, stop)
            if left.length == 0:
                break
            sequence = left


def test_an_elastic_restore_reads_every_remaining_sample_once() -> None:
    """Random layouts up to 64 ranks x 8 workers, ``drop``: after a restart at another layout
    no sample comes twice, and every sample comes but the fewer than ``W'`` that the new pass
    drops so that its ranks have equal parts (what the first pass dropped is read now)."""
    rng = random.Random(11)
    for _ in range(12):
        counts = np.array([rng.randint(1, 60) for _ in range(rng.randint(20, 90))])
        options = _options(rng, policy="drop")
        base = epoch_sequence(counts, options.seed, 0, options)
        layout = Layout(rng.randint(1, 64), rng.randint(1, 8), rng.choice([1, 2, 4]))
        shape = Shape.of(base.length, layout, options)
        record = PassRecord(layout, rng.randrange(shape.steps + 1))
        taken = shape.consumed_samples(record.consumed_steps)
        seen: collections.Counter[int] = collections.Counter()
        for rank in range(layout.world_size):
            for phase in range(layout.num_workers):
                order = _stream_positions(base, shape, options, rank, phase)
                seen.update(order[: int(taken[phase])])
        left = pass_sequence(base, 0, [record], options)
        after = Layout(rng.randint(1, 64), rng.randint(1, 8), rng.choice([1, 2, 4]))
        new_shape = Shape.of(left.length, after, options)
        for rank in range(after.world_size):
            part = [
                position
                for phase in range(after.num_workers)
                for position in _stream_positions(left, new_shape, options, rank, phase, 0, 1)
            ]
            assert len(part) == new_shape.per_rank  # equal parts: equal batches
            seen.update(part)
        assert max(seen.values(), default=1) == 1, "a sample came twice"
        assert len(seen) == base.length - left.length % after.world_size


def test_a_restore_builds_only_the_windows_a_rank_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """At 1,024 ranks x 8 workers the restore itself builds no window and keeps a template of
    streams x lanes; a rank's first windows build the few partly read ones its part covers."""
    built: list[StreamId] = []

    def counting(sequence, shape, options, stream, index):  # type: ignore[no-untyped-def]
        built.append(stream)
        return build_window(sequence, shape, options, stream, index)

    monkeypatch.setattr(leftover, "build_window", counting)
    options = PlanOptions(block_size=64, piece_size=8, num_open=512, chunk_size=4)
    base = epoch_sequence(np.full(100_000, 1000), 0, 0, options)  # 1e8 samples
    for world in (16, 1024):
        layout = Layout(world, 8, 256)
        steps = Shape.of(base.length, layout, options).steps // 2 + 3
        left = remainder(base, PassRecord(layout, steps), 0, 0, options)
        assert len(left.template.streams) <= 3 * 8 * 512  # streams x lanes, not ranks
    assert not built
    after = Shape.of(left.length, Layout(768, 8, 256), options)
    for phase in range(8):
        build_window(left, after, options, StreamId(0, 1, 767, phase), 0)
    # The last rank's part holds the last old ranks' leftovers (and wraps to rank 0's: pad).
    assert built and {stream.rank for stream in built} <= {0, 1021, 1022, 1023}


def _loaders(
    root: pathlib.Path, world: int, workers: int, batch: int, seed: int
) -> list[StreamingDataLoader]:
    """``world`` simulated ranks, each with ``workers`` real DataLoader workers."""
    loaders = []
    for rank in range(world):
        options = StreamOptions(
            output="dict", rank=rank, world_size=world, num_open=3, piece_size=2, chunk_size=2
        )
        dataset = StreamingDataset(
            root, seed=seed, batch_size=batch, policy="drop", options=options
        )
        loaders.append(StreamingDataLoader(dataset, num_workers=workers))
    return loaders


@pytest.mark.slow
@pytest.mark.parametrize("workers", [(0, 0), (0, 2), (2, 0)], ids=["0->0", "0->2", "2->0"])
def test_simulated_ranks_restore_at_random_layouts(
    tmp_path: pathlib.Path, workers: tuple[int, int]
) -> None:
    """Each sample at most once, all but the new pass's drops, equal batch counts per rank.

    Up to 64 ranks in one process; 3 with worker processes (each rank starts its own).
    """
    rng = random.Random(workers[0] * 10 + workers[1])
    root, _ = make_dataset(tmp_path, 700, 23)
    for case in range(3):
        before, after = (
            (rng.randint(2, 64 if count == 0 else 3), count, rng.choice([1, 2]))
            for count in workers
        )
        loaders = _loaders(root, *before, case)
        steps = rng.randrange(1, len(loaders[0]))
        iterators = [iter(loader) for loader in loaders]
        head = [key for _ in range(steps) for it in iterators for key in next(it)["__key__"]]
        for iterator in iterators:
            iterator.close()  # type: ignore[attr-defined]
        state = loaders[0].state_dict()
        restored = _loaders(root, *after, case)
        for loader in restored:
            loader.load_state_dict(state, allow_new_batch_size=True)
        batches = [list(loader) for loader in restored]
        assert len({len(rank) for rank in batches}) == 1, f"{before} -> {after}: batch counts"
        counts = collections.Counter(head + [key for rank in batches for key in keys_of(rank)])
        assert max(counts.values()) == 1, f"{before} -> {after}: a sample came twice"
        assert 700 - len(counts) < after[0], f"{before} -> {after}: samples missing"
