"""The same global batches at any world size and worker count, and restores that skip.

With ``StreamOptions(canonical_ranks=4, canonical_workers=2)`` and a fixed global batch
(``batch_size * world_size``), a run on 1 rank x 1 worker, 2 x 2 and 4 x 1 sees the same
sequence of global batches. Ranks are simulated in one process with explicit ``rank`` and
``world_size`` (the code path torch.distributed ranks take, see test_ddp.py), each with real
DataLoader worker processes, stepping in lockstep as DDP ranks do. Restores are also audited
(:class:`~shardstream.ResumeAudit`): across them, only ``pad``'s one repeat of 83 samples.
"""

from __future__ import annotations

import pathlib

import pytest

from shardstream import ResumeAudit
from shardstream.errors import ConfigError
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.streaming.shards import make_dataset

GLOBAL_BATCH = 8
NUM_SAMPLES = 83


def _loaders(
    root: pathlib.Path, world: int, workers: int, canonical: bool = True, epoch: int = 0
) -> list[StreamingDataLoader]:
    loaders = []
    for rank in range(world):
        options = StreamOptions(
            output="dict", rank=rank, world_size=world, num_open=3, piece_size=3,
            canonical_ranks=4 if canonical else None, canonical_workers=2 if canonical else None,
        )  # fmt: skip
        dataset = StreamingDataset(root, seed=5, batch_size=GLOBAL_BATCH // world, options=options)
        dataset.set_epoch(epoch)
        loaders.append(StreamingDataLoader(dataset, num_workers=workers))
    return loaders


def _global_batches(
    loaders: list[StreamingDataLoader],
    steps: int | None = None,
    audit: pathlib.Path | None = None,
    first: int = 0,
) -> list[list[str]]:
    """Each step's batches of all ranks, concatenated in rank order (recorded in ``audit``
    from step ``first``)."""
    iterators = [iter(loader) for loader in loaders]
    audits = [ResumeAudit(audit, rank=rank) for rank in range(len(loaders))] if audit else []
    batches: list[list[str]] = []
    while steps is None or len(batches) < steps:
        step = [next(it, None) for it in iterators]
        if all(batch is None for batch in step):
            break
        assert all(batch is not None for batch in step), "ranks must yield equal batch counts"
        for rank_audit, batch in zip(audits, step, strict=False):
            rank_audit.record(first + len(batches), batch)
        batches.append([key for batch in step for key in batch["__key__"]])  # type: ignore[index]
    if steps is not None:
        for iterator in iterators:
            iterator.close()  # type: ignore[attr-defined]
    return batches


@pytest.mark.slow
def test_global_batches_are_identical_at_1x1_2x2_and_4x1(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, NUM_SAMPLES, 9)
    reference = _global_batches(_loaders(root, 1, 0))
    keys = [key for batch in reference for key in batch]
    assert set(keys) == {f"s{i:06d}" for i in range(NUM_SAMPLES)}, "an epoch covers every sample"
    assert len(keys) - NUM_SAMPLES < 4, "pad repeats fewer than canonical_ranks samples"
    for world, workers in [(2, 2), (4, 1), (1, 2)]:
        assert _global_batches(_loaders(root, world, workers)) == reference, (world, workers)
    assert _global_batches(_loaders(root, 2, 2, epoch=1)) == _global_batches(
        _loaders(root, 1, 0, epoch=1)
    )
    assert _global_batches(_loaders(root, 1, 0, epoch=1)) != reference


@pytest.mark.slow
def test_a_restore_at_a_dividing_world_size_continues_the_same_batches(
    tmp_path: pathlib.Path,
) -> None:
    root, _ = make_dataset(tmp_path, NUM_SAMPLES, 9)
    reference = _global_batches(_loaders(root, 1, 0))
    old = _loaders(root, 1, 2)
    head = _global_batches(old, 4, tmp_path / "audit")
    state = old[0].state_dict()
    assert head == reference[:4] and state["history"] == [] and state["consumed_batches"] == 4
    new = _loaders(root, 4, 1)
    for loader in new:
        loader.load_state_dict(state, allow_new_batch_size=True)  # 8 per rank -> 2 per rank
    assert _global_batches(new, audit=tmp_path / "audit", first=4) == reference[4:]
    assert new[0].state_dict()["history"] == [], "a skip, not a new pass"
    _check_audit(tmp_path / "audit")


def _check_audit(folder: pathlib.Path) -> None:
    """The restored epoch: every sample, and only pad's one repeat (84 places for 83)."""
    (epoch,) = ResumeAudit.report(folder, expected=NUM_SAMPLES).epochs
    assert (epoch.consumed, epoch.duplicates, epoch.skips) == (84, 1, 0)


@pytest.mark.slow
def test_default_plans_continue_at_another_worker_count(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, NUM_SAMPLES, 9)
    reference = _global_batches(_loaders(root, 2, 2, canonical=False))
    old = _loaders(root, 2, 2, canonical=False)
    head = _global_batches(old, 5, tmp_path / "audit")
    state = old[0].state_dict()
    new = _loaders(root, 2, 1, canonical=False)  # 2 workers -> 1: the same pass goes on
    for loader in new:
        loader.load_state_dict(state)
    assert head + _global_batches(new, audit=tmp_path / "audit", first=5) == reference
    _check_audit(tmp_path / "audit")


def test_canonical_settings_are_checked(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 20, 5)
    with pytest.raises(ConfigError, match="batch_size"):
        StreamingDataset(root, options=StreamOptions(canonical_ranks=4))
    with pytest.raises(ConfigError, match="canonical_ranks"):
        StreamingDataset(root, batch_size=2, options=StreamOptions(canonical_workers=2))
    options = StreamOptions(canonical_ranks=4, rank=0, world_size=3)
    dataset = StreamingDataset(root, batch_size=4, options=options)
    with pytest.raises(ConfigError, match="divides"):
        len(dataset)
