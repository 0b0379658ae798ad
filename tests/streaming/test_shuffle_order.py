"""The default order mixes class-ordered shards like a random permutation, exactly and cheaply.

The quality checks use the plan alone (:mod:`shardstream.streaming._planning.windows`), on the
shape of data that motivated the design: 200 classes x 1,000 samples written in class order,
1,000 samples per shard (one class per shard). A test with real DataLoader workers checks that
the loader reads exactly that planned order.
"""

from __future__ import annotations

import itertools
import pathlib

import numpy as np
import pytest

from shardstream.errors import ConfigError
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from shardstream.streaming._control.resumestate import PassState
from shardstream.streaming._diagnostics.mixcheck import random_distinct, spearman
from shardstream.streaming._planning.mixing import MixedStream, MixtureSequence
from shardstream.streaming._planning.order import (
    ChunkOrder,
    ChunkSequence,
    DatasetFacts,
    PlanOptions,
    choose_order,
    epoch_sequence,
)
from shardstream.streaming._planning.sequence import ShardSequence
from shardstream.streaming._planning.split import Layout, PassPlan, Shape
from shardstream.streaming._planning.windows import interleave_labels, planned_batches
from tests.streaming.shards import make_dataset

CLASSES, PER_CLASS, BATCH = 200, 1000, 64
LOCAL = choose_order(DatasetFacts(indexed=True, local=True, mean_sample_bytes=1e5))


def _options(**changes: int) -> PlanOptions:
    values = {"seed": 0, "chunk_size": LOCAL.chunk_size, "num_open": LOCAL.num_open}
    values |= {"piece_size": LOCAL.piece_size, **changes}
    return PlanOptions(**values)


def _measure(world: int, workers: int, options: PlanOptions) -> tuple[float, float, int]:
    """(distinct classes per batch / random's, Spearman of written vs read order, samples)."""
    counts = np.full(CLASSES * PER_CLASS // 1000, 1000)
    sequence = epoch_sequence(counts, options.seed, 0, options)
    plan = PassPlan(sequence, Shape.of(sequence.length, Layout(world, workers, BATCH), options),
                    options, 0, 0)  # fmt: skip
    distinct, positions = [], []
    for rank in range(world):
        for shards, ordinals in planned_batches(plan, rank):
            written = shards * 1000 + ordinals
            distinct.append(len(np.unique(written // PER_CLASS)))
            positions.append(written)
    read = np.concatenate(positions)
    random = random_distinct(np.full(CLASSES, PER_CLASS), BATCH)
    assert len(np.unique(read)) == len(read) == CLASSES * PER_CLASS  # exact: each sample once
    return float(np.mean(distinct)) / random, spearman(read), len(read)


@pytest.mark.parametrize(("world", "workers"), [(1, 1), (1, 2), (1, 8), (4, 2)])
def test_default_order_mixes_class_ordered_shards_like_a_permutation(
    world: int, workers: int
) -> None:
    ratio, spearman, _ = _measure(world, workers, _options())
    assert ratio >= 0.9
    assert -0.1 <= spearman <= 0.1


def test_the_whole_shard_order_mixes_less_when_interleaved_uniformly() -> None:
    """The order that chunk_size=0 keeps (whole shards) in the uniform interleave of
    shardstream 0.2 is measurably worse: what chunks, then the stratified interleave, fix."""
    whole = {"seed": 0, "chunk_size": 0, "num_open": 64, "piece_size": 64}
    ratio, _, _ = _measure(1, 2, PlanOptions(**whole, interleave="uniform"))
    assert ratio < 0.8
    ratio, _, _ = _measure(1, 2, PlanOptions(**whole))
    assert ratio >= 0.9


def test_few_long_pieces_per_window_mix_when_they_take_turns() -> None:
    """The remote order's shape (long pieces, a window of 73 of them, 4 ranks x 2 workers): a
    uniform interleave draws a batch of 64 from about 42 of the 73 pieces; the stratified one
    from 64 of them, as many places as a random permutation's batch."""
    remote = {"seed": 0, "chunk_size": 128, "num_open": 73, "piece_size": 64, "block_size": 64}
    uniform, _, _ = _measure(4, 2, PlanOptions(**remote, interleave="uniform"))
    stratified, spearman, _ = _measure(4, 2, PlanOptions(**remote))
    assert uniform < 0.8 <= 0.9 <= stratified
    assert -0.1 <= spearman <= 0.1


def test_a_stratified_window_gives_every_stretch_one_sample_of_each_run() -> None:
    rng = np.random.default_rng(5)
    lengths = np.full(73, 40)
    labels = interleave_labels(lengths, rng, "stratified")
    assert sorted(labels.tolist()) == sorted(np.repeat(np.arange(73), 40).tolist())
    for start in range(0, len(labels), 73):
        assert len(np.unique(labels[start : start + 73])) == 73
    # Unequal runs are spread in proportion: every tenth of the window holds 4, 4 and 1.
    labels = interleave_labels(np.array([40, 40, 10]), rng, "stratified")
    for start in range(0, 90, 9):
        assert np.bincount(labels[start : start + 9], minlength=3).tolist() == [4, 4, 1]
    # Seeded: the same generator state gives the same interleave; another, another.
    again = interleave_labels(lengths, np.random.default_rng(5), "stratified")
    other = interleave_labels(lengths, np.random.default_rng(6), "stratified")
    first = interleave_labels(lengths, np.random.default_rng(5), "stratified")
    assert (again == first).all() and (again != other).any()


@pytest.mark.parametrize("share", [0.5, 0.6])
def test_mixture_of_two_class_ordered_datasets_mixes_too(share: float) -> None:
    """Also at 50/50, whose evenly alternating runs would otherwise align with the lanes."""
    options = _options()
    counts = np.full(100, 1000)
    first = int(share * 100_000)
    streams = [MixedStream(0, counts, first, 11), MixedStream(100, counts, 100_000 - first, 12)]
    sequence = MixtureSequence(streams, 0, options)
    plan = PassPlan(sequence, Shape.of(sequence.length, Layout(1, 2, BATCH), options),
                    options, 0, 0)  # fmt: skip
    distinct = [len(np.unique(shards)) for shards, _ in planned_batches(plan, 0)]
    # Each epoch takes first / 100 samples of each of A's shards, the rest of B's.
    random = random_distinct(np.repeat([first // 100, 1000 - first // 100], 100), BATCH)
    assert np.mean(distinct) / random >= 0.9


@pytest.mark.parametrize("size", [0, 1, 2, 3, 5, 64, 1000, 4097])
def test_chunk_order_is_a_bijection(size: int) -> None:
    order = ChunkOrder.seeded(size, [3, 1])
    assert sorted(order(number) for number in range(size)) == list(range(size))
    if size >= 64:
        other = ChunkOrder.seeded(size, [3, 2])
        assert [order(n) for n in range(size)] != [other(n) for n in range(size)]
        assert [order(n) for n in range(size)] != list(range(size))


def test_chunk_sequence_locates_every_sample_once_across_any_cut() -> None:
    counts = np.array([7, 0, 13, 5, 9, 11])
    shards = ShardSequence(counts, np.array([4, 0, 5, 1, 2, 3]))
    sequence = ChunkSequence(shards, 4, [9, 0])
    rng = np.random.default_rng(0)
    cuts = sorted({0, sequence.length, *rng.integers(0, sequence.length, 9).tolist()})
    seen = []
    for start, stop in itertools.pairwise(cuts):
        position = start
        for run in sequence.locate(start, stop):
            assert run.position == position  # positions are the chunked sequence's own
            position += run.num_samples
            seen.extend((run.shard, ordinal) for ordinal in range(run.first, run.stop))
        assert position == stop
    assert sorted(seen) == sorted((s, o) for s, n in enumerate(counts) for o in range(n))


@pytest.mark.parametrize("size", [1, 3, 64, 1000, 4097, 1 << 40])
def test_chunk_order_many_is_the_order_of_each(size: int) -> None:
    order = ChunkOrder.seeded(size, [3, 1])
    numbers = np.random.default_rng(size).integers(0, size, 500)
    assert order.many(numbers).tolist() == [order(number) for number in numbers.tolist()]


@pytest.mark.parametrize(("chunk_size", "shuffle"), [(4, True), (3, True), (1, True), (4, False)])
def test_a_windows_ranges_located_at_once_are_those_located_one_by_one(
    chunk_size: int, shuffle: bool
) -> None:
    """Short ranges (a window's), long ones across shards and the short last chunk, empty ones."""
    counts = np.array([7, 0, 13, 5, 9, 11, 2, 40])
    shards = ShardSequence(counts, np.array([4, 0, 5, 1, 2, 3, 7, 6]))
    sequence = ChunkSequence(shards, chunk_size, [9, 0], shuffle)
    rng = np.random.default_rng(chunk_size)
    ranges = [(0, 0), (0, sequence.length), (sequence.length - 2, sequence.length)]
    for _ in range(300):
        start = int(rng.integers(0, sequence.length))
        ranges.append((start, min(sequence.length, start + int(rng.integers(0, 12)))))
    assert sequence.locate_many(ranges) == [sequence.locate(a, b) for a, b in ranges]
    assert sequence.locate_many([]) == []


#: Remote shards, small dataset, many worker streams: the reads the guide recommends when each
#: rank's batches must mix (they are ~0.2 MiB here, against the default remote order's ~1.1 MiB).
MIXING_REMOTE = {"chunk_size": 256, "num_open": 512, "piece_size": 128, "block_size": 128}


@pytest.mark.parametrize(("world", "workers"), [(1, 2), (4, 2)])
def test_the_guides_short_remote_reads_mix_every_ranks_batches(world: int, workers: int) -> None:
    """With the default remote order a 4 x 2 stream of this 200,000-sample dataset reads about
    40 pieces of ~1 MiB (about 0.63 of random's classes per batch); the guide's numbers give
    every stream enough places for 0.9."""
    ratio, spearman, _ = _measure(world, workers, PlanOptions(seed=0, **MIXING_REMOTE))
    assert ratio >= 0.9
    assert -0.1 <= spearman <= 0.1


def test_small_datasets_still_mix_within_their_few_lanes() -> None:
    """A part with fewer units than lanes gets longer pieces, so its window is not tiny."""
    options = _options()
    shape = Shape.of(14, Layout(1, 1, 2), options)
    assert shape.lanes == 1 and shape.piece_size >= 14


@pytest.mark.slow
def test_real_loader_reads_the_planned_order(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 600, 30, num_classes=20)
    dataset = StreamingDataset(root, seed=4, batch_size=16, options=StreamOptions(output="dict"))
    assert dataset.settings.order == LOCAL  # local, indexed: the defaults the checks above use
    plan = dataset.plan(PassState(0), dataset.layout(2))
    planned = [
        [f"s{shard * 30 + ordinal:06d}" for shard, ordinal in zip(shards, ordinals, strict=True)]
        for shards, ordinals in planned_batches(plan, 0)
    ]
    read = [list(batch["__key__"]) for batch in StreamingDataLoader(dataset, num_workers=2)]
    assert read == planned


def test_states_of_the_whole_shard_order_resume_with_its_options(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 40, 7)
    old = StreamOptions(chunk_size=0, num_open=64, piece_size=64, interleave="uniform")
    loader = StreamingDataLoader(StreamingDataset(root, batch_size=4, options=old))
    state = loader.state_dict()
    state["version"] = 3  # as format 3 saved it: no chunk_size nor interleave in the fingerprint
    del state["fingerprint"]["chunk_size"], state["fingerprint"]["interleave"]
    StreamingDataLoader(StreamingDataset(root, batch_size=4, options=old)).load_state_dict(state)
    fresh = StreamingDataLoader(StreamingDataset(root, batch_size=4))
    with pytest.raises(ConfigError, match=r"chunk_size=0, num_open=64, piece_size=64, interl"):
        fresh.load_state_dict(state)


def test_a_state_of_the_uniform_interleave_finishes_its_epoch_exactly(
    tmp_path: pathlib.Path,
) -> None:
    """A mid-epoch state saved by shardstream 0.2 (format 4: windows interleaved uniformly)
    continues with ``interleave="uniform"`` into exactly the rest of its epoch, and a loader in
    the stratified default refuses it with the option to pass."""
    root, _ = make_dataset(tmp_path, 240, 30, num_classes=8)
    old = StreamOptions(output="dict", interleave="uniform")

    def loader(options: StreamOptions) -> StreamingDataLoader:
        dataset = StreamingDataset(root, seed=3, batch_size=8, options=options)
        return StreamingDataLoader(dataset, num_workers=2)

    whole = [list(batch["__key__"]) for batch in loader(old)]
    first = loader(old)
    batches = iter(first)
    head = [list(next(batches)["__key__"]) for _ in range(11)]
    state = first.state_dict()
    del batches
    state["version"] = 4  # as 0.2 saved it: no interleave in the fingerprint
    del state["fingerprint"]["interleave"]
    resumed = loader(old)
    resumed.load_state_dict(state)
    assert head + [list(batch["__key__"]) for batch in resumed] == whole
    stratified = [list(batch["__key__"]) for batch in loader(StreamOptions(output="dict"))]
    assert stratified != whole
    assert sorted(itertools.chain(*stratified)) == sorted(itertools.chain(*whole))
    with pytest.raises(ConfigError, match=r"format 4.*StreamOptions\(interleave='uniform'\)"):
        loader(StreamOptions(output="dict")).load_state_dict(state)
