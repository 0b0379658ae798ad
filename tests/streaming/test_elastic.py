"""Elastic resume: a state saved at W ranks x N workers restores at W' ranks x N' workers.

Ranks are simulated in one process with explicit ``rank``/``world_size`` (the same code path as
torch.distributed ranks, which tests/streaming/test_ddp.py covers); every rank steps in lockstep
as DDP ranks do, and only rank 0's state is saved, as Lightning does.
"""

from __future__ import annotations

import collections
import pathlib

import pytest

from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.streaming.shards import keys_of, make_dataset

NUM_SAMPLES = 61


def _loaders(
    root: pathlib.Path, world: int, workers: int, batch: int, policy: str
) -> list[StreamingDataLoader]:
    loaders = []
    for rank in range(world):
        options = StreamOptions(
            output="dict", rank=rank, world_size=world, shuffle_buffer=6, num_open=3, piece_size=4
        )
        dataset = StreamingDataset(root, seed=3, batch_size=batch, policy=policy, options=options)
        loaders.append(StreamingDataLoader(dataset, num_workers=workers))
    return loaders


def _lockstep(loaders: list[StreamingDataLoader], steps: int) -> list[str]:
    iterators = [iter(loader) for loader in loaders]
    keys = [key for _ in range(steps) for it in iterators for key in next(it)["__key__"]]
    for iterator in iterators:
        iterator.close()
    return keys


def _check_cover(keys: list[str], policy: str, max_extra: int) -> None:
    counts = collections.Counter(keys)
    every = {f"s{i:06d}" for i in range(NUM_SAMPLES)}
    if policy == "drop":
        assert max(counts.values()) == 1, "a sample came twice"
        assert set(counts) <= every and len(every - set(counts)) < max_extra
    else:
        assert set(counts) == every, f"missing: {sorted(every - set(counts))}"
        assert sum(counts.values()) - NUM_SAMPLES < max_extra


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["pad", "drop"])
@pytest.mark.parametrize(
    "before,after",
    [((2, 0, 3), (3, 0, 3)), ((3, 2, 2), (2, 0, 2)), ((2, 0, 3), (1, 2, 4))],
    ids=["2x1->3x1", "3x2->2x1", "2x1->1x2-batch4"],
)
def test_elastic_resume_covers_exactly_the_rest_of_the_epoch(
    tmp_path: pathlib.Path, policy: str, before: tuple, after: tuple
) -> None:
    root, _ = make_dataset(tmp_path, NUM_SAMPLES, 7)
    old = _loaders(root, *before, policy)
    head = _lockstep(old, 4)
    state = old[0].state_dict()  # rank 0's state only
    assert state["epoch"] == 0 and state["consumed_batches"] == 4

    def restore() -> list[StreamingDataLoader]:
        loaders = _loaders(root, *after, policy)
        for loader in loaders:
            loader.load_state_dict(state, allow_new_batch_size=after[2] != before[2])
        return loaders

    new = restore()
    rests = [keys_of(loader) for loader in new]
    counts = {len(list(loader)) for loader in restore()}
    assert len(counts) == 1, f"ranks yielded different numbers of batches: {counts}"
    assert len(new[0]) == 4 + counts.pop()  # a trainer counts the 4 batches before the restart
    _check_cover(head + [key for rest in rests for key in rest], policy, before[0] + after[0])
    assert [keys_of(loader) for loader in restore()] == rests, "not deterministic"
    # The next epoch is as a fresh run at the new size.
    fresh = _loaders(root, *after, policy)
    for loader in fresh:
        loader.dataset.set_epoch(1)
    assert [keys_of(loader) for loader in new] == [keys_of(loader) for loader in fresh]


@pytest.mark.slow
def test_two_elastic_restarts_in_one_epoch(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, NUM_SAMPLES, 7)
    first = _loaders(root, 2, 0, 2, "drop")
    keys = _lockstep(first, 5)
    state = first[0].state_dict()
    second = _loaders(root, 3, 0, 2, "drop")
    for loader in second:
        loader.load_state_dict(state)
    keys += _lockstep(second, 2)
    state = second[0].state_dict()
    assert len(state["history"]) == 1 and state["consumed_batches"] == 2
    third = _loaders(root, 1, 0, 2, "drop")
    third[0].load_state_dict(state)
    keys += keys_of(third[0])
    _check_cover(keys, "drop", 1)
