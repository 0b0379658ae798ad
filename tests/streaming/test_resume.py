"""Resuming a StreamingDataLoader mid-epoch yields exactly the rest of the uninterrupted epoch."""

from __future__ import annotations

import pathlib

import pytest

from shardstream.errors import ConfigError
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.streaming.conformance import assert_resumes
from tests.streaming.shards import make_dataset

OPTIONS = StreamOptions(output="dict", shuffle_buffer=8, num_open=3, piece_size=3, block_size=4)


def _batch_keys(batch: dict) -> tuple[str, ...]:
    return tuple(batch["__key__"])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_resume_conforms(tmp_path: pathlib.Path, num_workers: int) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)

    def make(epoch: int) -> StreamingDataLoader:
        dataset = StreamingDataset(root, seed=5, batch_size=3, options=OPTIONS)
        dataset.set_epoch(epoch)
        return StreamingDataLoader(dataset, num_workers=num_workers)

    assert_resumes(make, key=_batch_keys, num_points=3 if num_workers else 6, seed=num_workers)


def test_unbatched_resume_and_epoch_loop(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 20, 6)
    dataset = StreamingDataset(root, options=OPTIONS)
    loader = StreamingDataLoader(dataset)
    full = {epoch: [] for epoch in range(2)}
    for epoch in range(2):
        dataset.set_epoch(epoch)
        full[epoch] = [item["__key__"] for item in loader]
    dataset.set_epoch(0)
    iterator = iter(loader)
    head = [next(iterator)["__key__"] for _ in range(7)]
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["batches_consumed"] == 7

    restored_ds = StreamingDataset(root, options=OPTIONS)
    restored = StreamingDataLoader(restored_ds)
    restored.load_state_dict(state)
    seen = {}
    for epoch in range(state["epoch"], 2):
        restored_ds.set_epoch(epoch)  # same epoch: keeps the saved position
        seen[epoch] = [item["__key__"] for item in restored]
    assert head + seen[0] == full[0] and seen[1] == full[1]
    assert [item["__key__"] for item in restored] == full[1]  # a second pass starts over


def test_mismatched_settings_are_refused(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 20, 6)
    state = StreamingDataLoader(StreamingDataset(root, seed=1), num_workers=0).state_dict()
    other = StreamingDataLoader(StreamingDataset(root, seed=2), num_workers=0)
    with pytest.raises(ConfigError, match=r"seed was 1 .* but is 2"):
        other.load_state_dict(state)
