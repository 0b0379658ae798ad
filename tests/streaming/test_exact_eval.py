"""Exact evaluation (``policy="mask"``): every sample exactly once over all ranks, equal batches.

The big grid (sizes x world sizes x workers x batch sizes x shuffle) is checked on the plan,
torch-free, window by window, as the loader reads it (``test_shuffle_order`` checks the loader
reads exactly the plan); real DataLoader workers, 64 simulated ranks, mixtures, views and random
access check a representative subset end to end.
"""

from __future__ import annotations

import collections
import itertools
import pathlib
import random

import numpy as np
import pytest
import torch.utils.data
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream import ConfigError, RandomAccessDataset, make_view
from shardstream.streaming import Stream, StreamingDataLoader, StreamingDataset, StreamOptions
from shardstream.streaming._planning.leftover import PassRecord, remainder
from shardstream.streaming._planning.order import PlanOptions, epoch_sequence
from shardstream.streaming._planning.sequence import ShardSequence, shard_order
from shardstream.streaming._planning.split import Layout, PassPlan, Shape
from shardstream.streaming._planning.windows import (
    StreamId,
    StreamLanes,
    build_window,
    planned_batches,
)
from tests.streaming.conformance import assert_loader_resumes
from tests.streaming.shards import make_dataset
from tests.streaming.test_resume import OPTIONS, TORCHDATA_WARNING

SIZES = [1, 7, 1001, 10007]
WORLDS = [1, 2, 3, 4, 7, 64]
WORKERS = [0, 1, 2, 3]
BATCHES = [1, 16, 64]


def _stream_marks(plan: PassPlan, rank: int, phase: int) -> tuple[list[int], list[bool]]:
    """Base positions of one stream in reading order, with whether each is valid."""
    positions: list[int] = []
    valid: list[bool] = []
    lanes, index = StreamLanes(plan.shape, phase), 0
    stream = StreamId(plan.epoch, plan.pass_index, rank, phase)
    while lanes.before(index) < lanes.total:
        window = build_window(plan.sequence, plan.shape, plan.options, stream, index)
        firsts = np.array([run.position for run in window.runs], dtype=np.int64)
        positions += (firsts[window.labels] + window.ordinals).tolist()
        valid += (~window.fillers[window.labels]).tolist()
        index += 1
    return positions, valid


def _marked_positions(plan: PassPlan, rank: int) -> tuple[list[int], list[bool]]:
    """Base positions a plan rank reads, stream by stream, with whether each is valid."""
    positions: list[int] = []
    valid: list[bool] = []
    for phase in range(plan.shape.layout.num_workers):
        stream_positions, stream_valid = _stream_marks(plan, rank, phase)
        positions += stream_positions
        valid += stream_valid
    return positions, valid


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_the_mask_plan_counts_every_sample_once_on_the_whole_grid(shuffle: bool) -> None:
    for size, world, workers, batch in itertools.product(SIZES, WORLDS, WORKERS, BATCHES):
        options = PlanOptions(
            seed=size, shuffle=shuffle, policy="mask", block_size=16, piece_size=8,
            num_open=16, chunk_size=8,
        )  # fmt: skip
        counts = np.full(-(-size // 97), 97, dtype=np.int64)
        counts[-1] = size - 97 * (len(counts) - 1)
        sequence = epoch_sequence(counts, options.seed, 0, options)
        shape = Shape.of(size, Layout(world, max(1, workers), batch), options)
        plan = PassPlan(sequence, shape, options, 0, 0)
        case = (size, world, workers, batch)
        seen: collections.Counter[int] = collections.Counter()
        for rank in range(world):
            positions, valid = _marked_positions(plan, rank)
            assert len(positions) == shape.per_rank, case  # equal parts: equal batches
            seen.update(p for p, ok in zip(positions, valid, strict=True) if ok)
        assert sorted(seen) == list(range(size)) and max(seen.values()) == 1, case
        assert shape.steps == -(-shape.per_rank // batch), case  # the same steps on every rank


def test_planned_batches_have_the_same_sizes_on_every_rank() -> None:
    options = PlanOptions(seed=1, policy="mask", block_size=16, piece_size=8, num_open=16)
    sequence = ShardSequence(np.array([97] * 10 + [34]), shard_order(11, 1, 0))
    for world, workers, batch in [(7, 3, 16), (4, 2, 64), (64, 1, 1)]:
        shape = Shape.of(1004, Layout(world, workers, batch), options)
        plan = PassPlan(sequence, shape, options, 0, 0)
        sizes = {tuple(len(s) for s, _ in planned_batches(plan, rank)) for rank in range(world)}
        assert len(sizes) == 1, (world, workers, batch)


def test_a_masked_restart_leaves_exactly_the_samples_not_yet_read() -> None:
    """Fillers are never left for a later pass: over any restarts, every sample exactly once."""
    rng = random.Random(7)
    for _ in range(150):
        counts = np.array([rng.randint(0, 9) for _ in range(rng.randint(1, 12))], dtype=np.int64)
        counts[0] = max(counts[0], 1)
        options = PlanOptions(
            seed=rng.randrange(5), shuffle=rng.random() < 0.8, policy="mask",
            block_size=rng.choice([1, 2, 4]), piece_size=rng.choice([1, 2, 3]),
            num_open=rng.choice([1, 2, 5]),
        )  # fmt: skip
        base = ShardSequence(counts, shard_order(len(counts), options.seed, 0, options.shuffle))
        sequence, read = base, collections.Counter()
        for pass_index in range(3):
            layout = Layout(rng.randint(1, 5), rng.randint(1, 3), rng.choice([1, 2, 3]))
            shape = Shape.of(sequence.length, layout, options)
            plan = PassPlan(sequence, shape, options, 0, pass_index)
            steps = rng.randrange(shape.steps + 1) if pass_index < 2 else shape.steps
            taken = shape.consumed_samples(steps)
            streams = itertools.product(range(layout.world_size), range(layout.num_workers))
            for rank, phase in streams:
                positions, valid = _stream_marks(plan, rank, phase)
                count = int(taken[phase])  # a stream's consumed prefix
                read.update(p for p, ok in zip(positions[:count], valid[:count], strict=True) if ok)
            if steps == shape.steps:
                break
            sequence = remainder(sequence, PassRecord(layout, steps), 0, pass_index, options)
        assert read == collections.Counter(range(base.length))


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[int, pathlib.Path]:
    folder = tmp_path_factory.mktemp("exact")
    return {size: make_dataset(folder, size, 91)[0] for size in (7, 1001)}


def _valid_keys(
    root: pathlib.Path, world: int, workers: int, batch: int | None, shuffle: bool, **extra: object
) -> tuple[collections.Counter[str], set[int]]:
    """Valid keys over all (simulated) ranks, and the set of per-rank batch counts."""
    seen: collections.Counter[str] = collections.Counter()
    batches = set()
    for rank in range(world):
        options = StreamOptions(output="dict", rank=rank, world_size=world, **extra)  # type: ignore[arg-type]
        dataset = StreamingDataset(
            root, shuffle=shuffle, batch_size=batch, policy="mask", decode="raw", options=options
        )
        count = 0
        for item in StreamingDataLoader(dataset, num_workers=workers):
            count += 1
            keys = item["__key__"] if batch else [item["__key__"]]
            valid = item["__valid__"].tolist() if batch else [item["__valid__"]]
            if batch:
                assert item["__valid__"].dtype == torch.bool and len(valid) == len(keys)
            seen.update(key for key, ok in zip(keys, valid, strict=True) if ok)
        batches.add(count)
    return seen, batches


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker:UserWarning")  # 2 cores
@pytest.mark.parametrize(
    "size,world,workers,batch,shuffle",
    [(7, 3, 2, 16, True), (1001, 4, 3, 16, True), (1001, 7, 1, 64, False), (1001, 2, 0, None, True),
     (7, 64, 0, 1, False), (1001, 64, 0, 16, True)],
)  # fmt: skip
def test_real_loaders_yield_every_sample_once_in_equal_batches(
    data: dict[int, pathlib.Path], size: int, world: int, workers: int, batch: int | None,
    shuffle: bool,
) -> None:  # fmt: skip
    seen, batches = _valid_keys(data[size], world, workers, batch, shuffle)
    assert sorted(seen) == [f"s{i:06d}" for i in range(size)] and max(seen.values()) == 1
    assert len(batches) == 1, f"ranks yielded different numbers of batches: {batches}"


def test_pair_batches_carry_a_valid_tensor(data: dict[int, pathlib.Path]) -> None:
    options = StreamOptions(rank=3, world_size=4)  # the last rank: 248 real samples, 3 fillers
    dataset = StreamingDataset(data[1001], batch_size=16, policy="mask", options=options)
    batches = list(StreamingDataLoader(dataset, num_workers=1))
    assert {len(batch) for batch in batches} == {3}
    images, labels, valid = batches[-1]
    assert valid.dtype == torch.bool and len(valid) == len(labels) == len(images)
    assert sum(int(valid.sum()) for _, _, valid in batches) == 248
    assert sum(len(labels) for _, labels, _ in batches) == 251 == len(dataset) * 16 - 5
    single = StreamingDataset(data[7], policy="mask", options=StreamOptions(rank=2, world_size=3))
    assert [len(item) == 3 and isinstance(item[2], bool) for item in single] == [True] * 3


def test_a_mixture_and_a_view_are_counted_exactly(data: dict[int, pathlib.Path], tmp_path) -> None:  # type: ignore[no-untyped-def]
    view = tmp_path / "view"
    kept = make_view(data[1001], view, fraction=0.3).num_samples
    seen, batches = _valid_keys(view, 3, 1, 16, True)
    assert len(seen) == kept and max(seen.values()) == 1 and len(batches) == 1
    mixed = [Stream(data[7]), Stream(data[1001])]
    seen, batches = _valid_keys(mixed, 4, 2, 16, True)  # type: ignore[arg-type]
    assert sum(seen.values()) == 1008 and len(batches) == 1
    assert seen[f"s{0:06d}"] == 2 and max(seen.values()) == 2  # the key in both datasets


def test_mask_needs_sample_counts(data: dict[int, pathlib.Path]) -> None:
    pattern = str(data[7] / "shard-000000.tar")
    with pytest.raises(ConfigError, match=r"policy=.mask. needs .* `shardstream index`"):
        StreamingDataset(pattern, policy="mask")


@pytest.mark.parametrize("world", [1, 3, 4, 64])
def test_random_access_evaluation_parts_are_equal_and_exact(
    data: dict[int, pathlib.Path], world: int
) -> None:
    dataset = RandomAccessDataset(data[1001], decode="raw", options=StreamOptions(output="dict"))
    seen: collections.Counter[str] = collections.Counter()
    lengths = set()
    for rank in range(world):
        part = dataset.evaluation_part(rank, world)
        loader = torch.utils.data.DataLoader(part, batch_size=64, collate_fn=_collate_keys)
        lengths.add(len(loader))
        for keys, valid in loader:
            seen.update(key for key, ok in zip(keys, valid, strict=True) if ok)
    assert sorted(seen) == [f"s{i:06d}" for i in range(1001)] and max(seen.values()) == 1
    assert len(lengths) == 1
    images, _, valid = RandomAccessDataset(data[7]).evaluation_part(2, 3)[2]
    assert valid is False and images.shape[0] == 3


def _collate_keys(samples: list[dict]) -> tuple[list[str], list[bool]]:
    return [s["__key__"] for s in samples], [s["__valid__"] for s in samples]


@pytest.mark.slow
@pytest.mark.filterwarnings(TORCHDATA_WARNING)
@pytest.mark.parametrize("stateful", [False, True], ids=["StreamingDataLoader", "Stateful"])
def test_a_masked_rank_resumes_exactly(tmp_path: pathlib.Path, stateful: bool) -> None:
    """The last of 3 ranks over 44 samples: 14 real samples and a filler, resumed anywhere."""
    root, _ = make_dataset(tmp_path, 44, 7)
    options = StreamOptions(**{**vars(OPTIONS), "rank": 2, "world_size": 3})

    def make() -> torch.utils.data.DataLoader:
        dataset = StreamingDataset(root, seed=5, batch_size=3, policy="mask", options=options)
        if stateful:
            return StatefulDataLoader(dataset, batch_size=None, num_workers=2)
        return StreamingDataLoader(dataset, num_workers=2)

    def marked(batch: dict) -> tuple:
        return tuple(zip(batch["__key__"], batch["__valid__"].tolist(), strict=True))

    assert sum(not valid for batch in make() for _, valid in marked(batch)) == 1
    assert_loader_resumes(make, key=marked, seed=int(stateful))
