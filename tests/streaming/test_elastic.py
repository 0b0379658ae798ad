"""Elastic resume: a state saved at W ranks x N workers restores at W' ranks x N' workers.

Ranks are simulated in one process with explicit ``rank``/``world_size`` (the same code path as
torch.distributed ranks, which tests/streaming/test_ddp.py covers); every rank steps in lockstep
as DDP ranks do, and only rank 0's state is saved, as Lightning does. Every rank's steps are
recorded with :class:`~shardstream.ResumeAudit`, whose counts across the restarts must be the
exact ones: none for ``mask``, the repeated samples for ``pad`` and the left out ones for
``drop``.
"""

from __future__ import annotations

import collections
import pathlib
from typing import Any

import pytest

from shardstream import ResumeAudit
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.streaming.shards import make_dataset

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


def _lockstep(
    loaders: list[StreamingDataLoader], steps: int, audit: pathlib.Path, first: int = 0
) -> list[str]:
    """``steps`` steps of every rank in turn (recorded from step ``first``): the valid keys."""
    iterators = [iter(loader) for loader in loaders]
    audits = [ResumeAudit(audit, rank=rank) for rank in range(len(loaders))]
    keys = []
    for step in range(first, first + steps):
        for iterator, rank_audit in zip(iterators, audits, strict=True):
            batch = next(iterator)
            rank_audit.record(step, batch)
            keys += _valid(batch)
    for iterator in iterators:
        iterator.close()
    return keys


def _rest(loader: StreamingDataLoader, audit: pathlib.Path, rank: int, first: int) -> list[str]:
    """The rest of the epoch on one rank, recorded from step ``first``: the valid keys."""
    rank_audit = ResumeAudit(audit, rank=rank)
    keys = []
    for step, batch in enumerate(loader, first):
        rank_audit.record(step, batch)
        keys += _valid(batch)
    return keys


def _valid(batch: dict[str, Any]) -> list[str]:
    marks = batch["__valid__"].tolist() if "__valid__" in batch else [True] * len(batch["__key__"])
    return [key for key, valid in zip(batch["__key__"], marks, strict=True) if valid]


def _check_cover(keys: list[str], policy: str, max_extra: int, audit: pathlib.Path) -> None:
    counts = collections.Counter(keys)
    every = {f"s{i:06d}" for i in range(NUM_SAMPLES)}
    if policy == "drop":
        assert max(counts.values()) == 1, "a sample came twice"
        assert set(counts) <= every and len(every - set(counts)) < max_extra
    else:
        assert set(counts) == every, f"missing: {sorted(every - set(counts))}"
        assert sum(counts.values()) - NUM_SAMPLES < max_extra
    if policy == "mask":
        assert max(counts.values()) == 1, "a sample came twice"
    (report,) = ResumeAudit.report(audit, expected=NUM_SAMPLES).epochs
    assert report.duplicates == sum(counts.values()) - len(counts)  # exact, as the keys say
    assert report.skips == NUM_SAMPLES - len(counts)


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["pad", "drop", "mask"])
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
    audit = tmp_path / "audit"
    head = _lockstep(old, 4, audit)
    state = old[0].state_dict()  # rank 0's state only
    assert state["epoch"] == 0 and state["consumed_batches"] == 4

    def restore() -> list[StreamingDataLoader]:
        loaders = _loaders(root, *after, policy)
        for loader in loaders:
            loader.load_state_dict(state, allow_new_batch_size=after[2] != before[2])
        return loaders

    new = restore()
    rests = [_rest(loader, audit, rank, 4) for rank, loader in enumerate(new)]
    counts = {len(list(loader)) for loader in restore()}
    assert len(counts) == 1, f"ranks yielded different numbers of batches: {counts}"
    assert len(new[0]) == 4 + counts.pop()  # a trainer counts the 4 batches before the restart
    keys = head + [key for rest in rests for key in rest]
    _check_cover(keys, policy, before[0] + after[0], audit)
    assert [_valid_keys(loader) for loader in restore()] == rests, "not deterministic"
    # The next epoch is as a fresh run at the new size.
    fresh = _loaders(root, *after, policy)
    for loader in fresh:
        loader.dataset.set_epoch(1)
    assert [_valid_keys(loader) for loader in new] == [_valid_keys(loader) for loader in fresh]


@pytest.mark.slow
def test_two_elastic_restarts_in_one_epoch(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, NUM_SAMPLES, 7)
    audit = tmp_path / "audit"
    first = _loaders(root, 2, 0, 2, "drop")
    keys = _lockstep(first, 5, audit)
    state = first[0].state_dict()
    second = _loaders(root, 3, 0, 2, "drop")
    for loader in second:
        loader.load_state_dict(state)
    keys += _lockstep(second, 2, audit, first=5)
    state = second[0].state_dict()
    assert len(state["history"]) == 1 and state["consumed_batches"] == 2
    third = _loaders(root, 1, 0, 2, "drop")
    third[0].load_state_dict(state)
    keys += _rest(third[0], audit, 0, 7)
    _check_cover(keys, "drop", 1, audit)
    assert ResumeAudit.report(audit).restarts == [(0, 5), (0, 7)]


def _valid_keys(loader: StreamingDataLoader) -> list[str]:
    return [key for batch in loader for key in _valid(batch)]
