"""Resume in every loader people train with: StreamingDataLoader, StatefulDataLoader, plain.

One conformance helper (``tests.streaming.conformance.assert_loader_resumes``) checks every
path: mid-epoch, start, end of epoch and the epoch after, with and without (persistent)
DataLoader workers, and with no ``set_epoch`` call at all.
"""

from __future__ import annotations

import pathlib

import pytest
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream.errors import ConfigError
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.streaming.conformance import assert_loader_resumes
from tests.streaming.shards import keys_of, make_dataset

OPTIONS = StreamOptions(output="dict", shuffle_buffer=8, num_open=3, piece_size=3, block_size=4)
#: torchdata 0.11 calls a torch API that torch 2.14 deprecates (its own warning, not ours).
TORCHDATA_WARNING = "ignore:'set_vital' is deprecated:UserWarning"
WORKERS = [
    pytest.param({"num_workers": 0}, id="0-workers"),
    pytest.param({"num_workers": 2}, id="2-workers"),
    pytest.param({"num_workers": 2, "persistent_workers": True}, id="2-persistent"),
]


def _batch_keys(batch: dict) -> tuple[str, ...]:
    return tuple(batch["__key__"])


@pytest.mark.slow
@pytest.mark.parametrize("loader_args", WORKERS)
def test_streaming_dataloader_resumes(tmp_path: pathlib.Path, loader_args: dict) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)

    def make() -> StreamingDataLoader:
        dataset = StreamingDataset(root, seed=5, batch_size=3, options=OPTIONS)
        return StreamingDataLoader(dataset, **loader_args)

    assert_loader_resumes(make, key=_batch_keys, seed=len(loader_args))


@pytest.mark.slow
@pytest.mark.filterwarnings(TORCHDATA_WARNING)
@pytest.mark.parametrize("loader_args", WORKERS)
def test_stateful_dataloader_resumes(tmp_path: pathlib.Path, loader_args: dict) -> None:
    root, _ = make_dataset(tmp_path, 45, 7)

    def make() -> StatefulDataLoader:
        dataset = StreamingDataset(root, seed=5, batch_size=3, options=OPTIONS)
        return StatefulDataLoader(dataset, batch_size=None, **loader_args)

    assert_loader_resumes(make, key=_batch_keys, seed=len(loader_args))


def test_unbatched_streaming_dataloader_resumes(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 20, 6)

    def make() -> StreamingDataLoader:
        return StreamingDataLoader(StreamingDataset(root, options=OPTIONS))

    assert_loader_resumes(make, key=lambda item: item["__key__"], num_points=3)


@pytest.mark.slow
def test_plain_persistent_dataloader_moves_on_and_follows_set_epoch(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 30, 7)
    dataset = StreamingDataset(root, seed=3, batch_size=2, options=OPTIONS)
    loader = DataLoader(dataset, batch_size=None, num_workers=2, persistent_workers=True)
    first, second = keys_of(loader), keys_of(loader)
    assert first != second and sorted(first) == sorted(second) == sorted(set(first))
    reference = StreamingDataset(root, seed=3, batch_size=2, options=OPTIONS)
    expected = [keys_of(DataLoader(reference, batch_size=None, num_workers=2)) for _ in range(3)]
    assert [first, second] == expected[:2]
    dataset.set_epoch(0)  # reaches the persistent workers: epoch 0 again, then on to 1
    assert keys_of(loader) == first and keys_of(loader) == second


def test_epoch_loop_with_set_epoch_keeps_the_resume_point(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 20, 6)
    dataset = StreamingDataset(root, options=OPTIONS)
    loader = StreamingDataLoader(dataset)
    full = {}
    for epoch in range(3):
        dataset.set_epoch(epoch)
        full[epoch] = [item["__key__"] for item in loader]
    dataset.set_epoch(1)
    iterator = iter(loader)
    head = [next(iterator)["__key__"] for _ in range(7)]
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["consumed_batches"] == 7

    restored_ds = StreamingDataset(root, options=OPTIONS)
    restored = StreamingDataLoader(restored_ds)
    restored.load_state_dict(state)
    seen = {}
    for epoch in range(state["epoch"], 3):
        restored_ds.set_epoch(epoch)  # the saved epoch: keeps the saved position
        seen[epoch] = [item["__key__"] for item in restored]
    assert head + seen[1] == full[1] and seen[2] == full[2]


def test_mismatched_settings_are_refused(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 20, 6)
    state = StreamingDataLoader(StreamingDataset(root, seed=1), num_workers=0).state_dict()
    other = StreamingDataLoader(StreamingDataset(root, seed=2), num_workers=0)
    with pytest.raises(ConfigError, match=r"seed was 1 .* but is 2"):
        other.load_state_dict(state)
    smaller = StreamingDataLoader(StreamingDataset(root, seed=1, batch_size=2))
    with pytest.raises(ConfigError, match=r"batch_size was 1 .* 2 now; pass allow_new_batch_size"):
        smaller.load_state_dict(state)


def test_dataset_state_refuses_another_world_size(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 20, 6)
    one = StreamingDataset(root, batch_size=2, options=OPTIONS)
    next(iter(one))
    state = one.state_dict()
    two = StreamingDataset(
        root, batch_size=2, options=StreamOptions(**{**vars(OPTIONS), "rank": 0, "world_size": 2})
    )
    with pytest.raises(ConfigError, match=r"world_size was 1 .* 2 now.*StreamingDataLoader"):
        two.load_state_dict(state)


@pytest.mark.parametrize("loader_args", WORKERS)
def test_shards_without_a_manifest_resume_where_they_stopped(
    tmp_path: pathlib.Path, loader_args: dict
) -> None:
    """Without counts a worker's turn is known only while every worker still yields, so the
    resume is exact from any point of the first half of an epoch (and, without workers, from
    any point): the rest of the epoch, then the next epoch."""
    root, manifest = make_dataset(tmp_path, 45, 7)
    pattern = str(root / f"shard-{{000000..{len(manifest.shards) - 1:06d}}}.tar")

    def make() -> StreamingDataLoader:
        dataset = StreamingDataset(pattern, seed=5, batch_size=3, options=OPTIONS)
        return StreamingDataLoader(dataset, **loader_args)

    loader = make()
    epochs = [[_batch_keys(batch) for batch in loader] for _ in range(2)]
    last = len(epochs[0]) if loader_args["num_workers"] == 0 else len(epochs[0]) // 2
    for point in (1, last // 2, last - 1):
        loader = make()
        iterator = iter(loader)
        head = [_batch_keys(next(iterator)) for _ in range(point)]
        state = loader.state_dict()
        del iterator
        resumed = make()
        resumed.load_state_dict(state)
        assert head + [_batch_keys(batch) for batch in resumed] == epochs[0], point
        assert [_batch_keys(batch) for batch in resumed] == epochs[1], point
