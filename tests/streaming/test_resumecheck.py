"""The loader's position in trainer terms, and the one call that checks it after a restore.

A restored loader must be where the trainer is (its step, times the gradient accumulation);
a loader whose state was dropped, or restored from another checkpoint, must fail loudly with
both positions, in StreamingDataLoader and torchdata's StatefulDataLoader alike.
"""

from __future__ import annotations

import logging
import pathlib

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream import ResumeError, check_position
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.streaming.shards import make_dataset
from tests.streaming.test_resume import OPTIONS, TORCHDATA_WARNING


def _loader(root: pathlib.Path, workers: int = 0, **options: object) -> StreamingDataLoader:
    dataset = StreamingDataset(
        root, seed=5, batch_size=3, options=StreamOptions(**{**vars(OPTIONS), **options})
    )
    return StreamingDataLoader(dataset, num_workers=workers)


def _take(loader: StreamingDataLoader, count: int) -> dict:
    iterator = iter(loader)
    for _ in range(count):
        next(iterator)
    state = loader.state_dict()
    iterator.close()
    return state


def test_the_position_counts_batches_of_every_epoch(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)  # 15 batches of 3 per epoch
    loader = _loader(root, workers=2)
    assert str(loader.position()) == "epoch 0, batch 0 of 15 (0 batches in all)"
    for _ in range(2):
        list(loader)
    assert str(loader.position()) == "epoch 2, batch 0 of 15 (30 batches in all)"  # the next
    state = _take(loader, 4)
    assert state["global_batches"] == 34 and state["consumed_batches"] == 4
    restored = _loader(root)
    restored.load_state_dict(state)
    position = check_position(restored, 34)
    assert (position.epoch, position.epoch_batches, position.epoch_length) == (2, 4, 15)
    check_position(restored, 17, grad_accumulation=2)
    assert len(list(restored)) == 11 and restored.position().global_batches == 45
    check_position(_loader(root), 0)  # a fresh run at step 0


def test_a_dropped_or_foreign_state_fails_naming_both_positions(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)
    state = _take(_loader(root), 9)
    with pytest.raises(
        ResumeError,
        match=r"loader is at epoch 0, batch 0 of 15 \(0 batches in "
        r"all\), but the trainer is at step 9 \(9 batches\)",
    ):
        check_position(_loader(root), 9)  # the state was never restored
    older = _loader(root)
    older.load_state_dict(_take(_loader(root), 5))  # another checkpoint's state
    with pytest.raises(
        ResumeError,
        match=r"epoch 0, batch 5 of 15 .* step 3 x 3 batches per "
        r"step \(9 batches\)",
    ):
        check_position(older, 3, grad_accumulation=3)
    restored = _loader(root)
    restored.load_state_dict(state)
    check_position(restored, 3, grad_accumulation=3)


def test_an_elastic_restore_keeps_the_count_and_logs_one_line(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)
    two = [_loader(root, rank=rank, world_size=2) for rank in range(2)]  # 8 batches per rank
    list(two[0])
    state = _take(two[0], 3)
    assert state["global_batches"] == 11
    one = _loader(root)
    with caplog.at_level(logging.INFO, logger="shardstream.streaming"):
        one.load_state_dict(state)
    (line,) = [r.getMessage() for r in caplog.records if "restored" in r.getMessage()]
    left = len(one) - 3
    assert line == (
        f"rank 0 of 1: loader restored at epoch 1, batch 3 of {len(one)} (11 batches in all), "
        f"{left} batches left"
    )
    check_position(one, 11)
    assert len(list(one)) == left and one.position().global_batches == 11 + left


def test_a_state_saved_before_the_count_existed_is_estimated(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)
    loader = _loader(root)
    list(loader)
    state = _take(loader, 2)
    del state["global_batches"]  # as saved before the count was recorded
    restored = _loader(root)
    restored.load_state_dict(state)
    assert restored.position().global_batches == 17  # epoch 1 x 15 batches + 2


def test_set_epoch_loops_count_every_epoch_once(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)
    loader = _loader(root)
    for epoch in range(3):
        loader.dataset.set_epoch(epoch)
        list(loader)
    check_position(loader, 45)


@pytest.mark.filterwarnings(TORCHDATA_WARNING)
@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_positions_are_checked_too(
    tmp_path: pathlib.Path, workers: int, caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)

    def make() -> StatefulDataLoader:
        dataset = StreamingDataset(root, seed=5, batch_size=3, options=OPTIONS)
        return StatefulDataLoader(dataset, batch_size=None, num_workers=workers)

    loader = make()
    list(loader)
    iterator = iter(loader)
    for _ in range(4):
        next(iterator)
    state = loader.state_dict()
    del iterator
    check_position(make(), 0)
    restored = make()
    restored.load_state_dict(state)
    position = check_position(restored, 19)
    assert (position.epoch, position.epoch_batches) == (1, 4)
    with pytest.raises(ResumeError, match=r"epoch 0, batch 0 of 15 .* step 19 \(19 batches\)"):
        check_position(make(), 19)
    with caplog.at_level(logging.INFO, logger="shardstream.streaming"):
        assert len(list(restored)) == 11
    if workers == 0:  # restored in this process (with workers, in worker 0: its own log)
        (line,) = [r.getMessage() for r in caplog.records if "restored" in r.getMessage()]
        assert line == (
            "rank 0 of 1: dataset state restored in epoch 1; the loader goes on at batch 4 of "
            "15 (11 batches left)"
        )
