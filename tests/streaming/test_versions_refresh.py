"""Moving a running job to a newer version: ``refresh_version`` and ``follow_versions``."""

from __future__ import annotations

import itertools
import pathlib

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream.errors import ConfigError
from shardstream.shardwriter import build_shards
from shardstream.streaming import (
    Stream,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
)
from tests.shardwriter.growth import write_day
from tests.streaming.shards import keys_of

BUILD = {"max_samples_per_shard": 3}
FOLLOW = StreamOptions(output="dict", follow_versions=True)
TORCHDATA_WARNING = "ignore:'set_vital' is deprecated:UserWarning"


@pytest.fixture
def dataset(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """Version 1 (24 samples) of a dataset, and the day-2 tree (10 samples) to append."""
    dest = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1, per_class=12), dest, **BUILD)
    return dest, write_day(tmp_path / "day2", 2, per_class=5)


def _make(root: pathlib.Path, options: StreamOptions = FOLLOW, **kwargs) -> StreamingDataset:
    return StreamingDataset(root, seed=4, batch_size=2, decode="raw", options=options, **kwargs)


def test_refresh_version_moves_fresh_epochs_and_keeps_the_one_under_way(dataset):
    root, day2 = dataset
    loader = StreamingDataLoader(_make(root, StreamOptions(output="dict")))
    begun = keys_of(itertools.islice(loader, 3))
    build_shards(day2, root, append=True, **BUILD)
    assert loader.dataset.version == 1 and loader.dataset.refresh_version() == 2
    assert loader.dataset.version == 2 and len(loader.dataset) == 17
    rest = keys_of(loader)  # the epoch under way ends on version 1
    assert len(begun + rest) == len(set(begun + rest)) == 24
    assert loader.state_dict()["dataset_version"] == 1
    following = keys_of(loader)
    assert len(following) == 34 and loader.state_dict()["dataset_version"] == 2


@pytest.mark.slow
def test_follow_versions_moves_persistent_workers_at_each_epoch(dataset):
    root, day2 = dataset
    loader = StreamingDataLoader(_make(root), num_workers=2, persistent_workers=True)
    first = keys_of(loader)
    build_shards(day2, root, append=True, **BUILD)
    second = keys_of(loader)
    assert (len(first), len(second)) == (24, 34) and len(loader) == 17
    assert loader.state_dict()["dataset_version"] == 2


@pytest.mark.slow
@pytest.mark.filterwarnings(TORCHDATA_WARNING)
def test_follow_versions_moves_a_stateful_dataloader_at_set_epoch(dataset):
    root, day2 = dataset
    dataset_ = _make(root)
    loader = StatefulDataLoader(dataset_, batch_size=None, num_workers=2, persistent_workers=True)
    dataset_.set_epoch(0)
    first = keys_of(loader)
    build_shards(day2, root, append=True, **BUILD)
    dataset_.set_epoch(1)  # the training process moves; the persistent workers follow
    second = keys_of(loader)
    assert (len(first), len(second)) == (24, 34)
    assert sum("day2" in key for key in second) == 10


def test_a_mixture_follows_each_stream_it_does_not_pin(dataset, tmp_path):
    root, day2 = dataset
    other = tmp_path / "other"
    build_shards(write_day(tmp_path / "o1", 7, per_class=2), other, **BUILD)
    streams = [Stream(root), Stream(other, version=1)]
    mixed = StreamingDataset(streams, decode="raw", options=FOLLOW)
    build_shards(day2, root, append=True, **BUILD)
    build_shards(write_day(tmp_path / "o2", 8, per_class=2), other, append=True, **BUILD)
    assert mixed.version == (1, 1) and mixed.refresh_version() == (2, 1)
    assert len(keys_of(mixed)) == 34 + 4


def test_a_version_that_cannot_move_is_refused(dataset):
    root, _ = dataset
    with pytest.raises(ConfigError, match="version=1 pins a version and follow_versions"):
        _make(root, version=1)
    with pytest.raises(ConfigError, match="pin version=N on every rank instead"):
        _make(root, StreamOptions(follow_versions=True, rank=0, world_size=2))
    with pytest.raises(ConfigError, match="made with version=1, which stays"):
        _make(root, StreamOptions(), version=1).refresh_version()
    with pytest.raises(ConfigError, match="cannot move to a new version together"):
        _make(root, StreamOptions(rank=1, world_size=2)).refresh_version()
