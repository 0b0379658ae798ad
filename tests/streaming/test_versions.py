"""Streaming a dataset that grows: one version per epoch, resume across an append."""

from __future__ import annotations

import itertools
import pathlib

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

from shardstream._catalog.versions import prune_versions
from shardstream._storage import Store
from shardstream.errors import ConfigError, ManifestNotFoundError
from shardstream.shardwriter import build_shards
from shardstream.streaming import (
    RandomAccessDataset,
    Stream,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
)
from tests.shardwriter.growth import write_day
from tests.streaming.shards import keys_of

OPTIONS = StreamOptions(output="dict")
BUILD = {"max_samples_per_shard": 3}
TORCHDATA_WARNING = "ignore:'set_vital' is deprecated:UserWarning"


@pytest.fixture
def dataset(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """Version 1 (24 samples) of a dataset, and the day-2 tree (10 samples) to append."""
    dest = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1, per_class=12), dest, **BUILD)
    return dest, write_day(tmp_path / "day2", 2, per_class=5)


def _make(root: pathlib.Path, version: int | None = None) -> StreamingDataset:
    return StreamingDataset(
        root, seed=4, batch_size=2, decode="raw", options=OPTIONS, version=version
    )


def _epoch(root: pathlib.Path, version: int, epoch: int, workers: int = 2) -> list[str]:
    reference = _make(root, version)
    reference.set_epoch(epoch)
    return keys_of(StreamingDataLoader(reference, num_workers=workers))


def test_versions_are_read_by_number(dataset):
    root, day2 = dataset
    build_shards(day2, root, append=True, **BUILD)
    old, new = _make(root, version=1), _make(root)
    assert (old.version, new.version) == (1, 2)
    assert len(old) == 12 and len(new) == 17
    old_keys = keys_of(StreamingDataLoader(old))
    assert len(old_keys) == 24 and not any("day2" in key for key in old_keys)
    assert sum("day2" in key for key in keys_of(StreamingDataLoader(new))) == 10
    assert len(RandomAccessDataset(root, version=1, decode="raw")) == 24
    prune_versions(Store(str(root)), keep=1)
    with pytest.raises(ManifestNotFoundError, match="has no version 1"):
        _make(root, version=1)


@pytest.mark.slow
@pytest.mark.parametrize("resume_workers", [2, 1])
def test_resume_after_an_append_finishes_the_epoch_on_the_old_version(dataset, resume_workers):
    root, day2 = dataset
    expected = _epoch(root, 1, 0)
    loader = StreamingDataLoader(_make(root), num_workers=2)
    consumed = keys_of(itertools.islice(loader, 5))
    state = loader.state_dict()
    assert state["dataset_version"] == 1 and consumed == expected[:10]
    build_shards(day2, root, append=True, **BUILD)  # the dataset grows under the job
    restarted = StreamingDataLoader(_make(root), num_workers=resume_workers)
    restarted.load_state_dict(state)
    assert len(restarted) == 12  # the interrupted epoch's length: version 1's
    assert keys_of(restarted) == expected[10:]
    assert restarted.state_dict()["dataset_version"] == 1
    following = keys_of(restarted)  # the next epoch reads the newest version
    assert following == _epoch(root, 2, 1, resume_workers) and len(following) == 34
    assert restarted.state_dict()["dataset_version"] == 2


@pytest.mark.slow
def test_a_state_saved_before_versions_existed_resumes_on_version_1(dataset):
    root, day2 = dataset
    expected = _epoch(root, 1, 0)
    loader = StreamingDataLoader(_make(root), num_workers=2)
    keys_of(itertools.islice(loader, 3))
    state = loader.state_dict()
    del state["dataset_version"]  # as saved by shardstream before this release
    build_shards(day2, root, append=True, **BUILD)
    restarted = StreamingDataLoader(_make(root), num_workers=2)
    restarted.load_state_dict(state)
    assert keys_of(restarted) == expected[6:]


def test_resume_on_a_pruned_version_is_refused(dataset):
    root, day2 = dataset
    loader = StreamingDataLoader(_make(root))
    keys_of(itertools.islice(loader, 2))
    state = loader.state_dict()
    build_shards(day2, root, append=True, **BUILD)
    prune_versions(Store(str(root)), keep=1)
    with pytest.raises(ConfigError, match="reads version 1 of the dataset, which can no longer"):
        StreamingDataLoader(_make(root)).load_state_dict(state)


def test_a_pinned_version_stays_after_the_dataset_grew(dataset):
    root, day2 = dataset
    pinned = StreamingDataLoader(_make(root, version=1))
    first = keys_of(pinned)
    build_shards(day2, root, append=True, **BUILD)
    assert sorted(keys_of(pinned)) == sorted(first) and len(first) == 24


@pytest.mark.slow
@pytest.mark.filterwarnings(TORCHDATA_WARNING)
def test_stateful_dataloader_resumes_across_an_append(dataset):
    root, day2 = dataset
    expected = _epoch(root, 1, 0)

    def make() -> StatefulDataLoader:
        return StatefulDataLoader(_make(root), batch_size=None, num_workers=2)

    loader = make()
    consumed = keys_of(itertools.islice(iter(loader), 4))
    state = loader.state_dict()
    build_shards(day2, root, append=True, **BUILD)
    restarted = make()
    restarted.load_state_dict(state)
    assert consumed + keys_of(restarted) == expected
    assert len(keys_of(restarted)) == 34  # the next epoch: version 2


@pytest.mark.slow
def test_a_mixture_resumes_across_an_append_to_one_stream(dataset, tmp_path):
    root, day2 = dataset
    other = tmp_path / "other"
    build_shards(write_day(tmp_path / "day9", 9, per_class=4), other, **BUILD)

    def make(first: int | None = None) -> StreamingDataset:
        streams = [Stream(root, version=first), Stream(other)]
        return StreamingDataset(streams, seed=4, batch_size=2, decode="raw", options=OPTIONS)

    reference = make()
    expected = keys_of(StreamingDataLoader(reference, num_workers=2))
    loader = StreamingDataLoader(make(), num_workers=2)
    consumed = keys_of(itertools.islice(loader, 4))
    state = loader.state_dict()
    assert state["dataset_version"] == [1, 1]
    build_shards(day2, root, append=True, **BUILD)
    restarted = StreamingDataLoader(make(), num_workers=2)
    restarted.load_state_dict(state)
    assert consumed + keys_of(restarted) == expected and len(expected) == 24 + 8
    following = keys_of(restarted)
    pinned_new = make(first=2)
    pinned_new.set_epoch(1)
    assert following == keys_of(StreamingDataLoader(pinned_new, num_workers=2))
    assert len(following) == 34 + 8 and restarted.state_dict()["dataset_version"] == [2, 1]


def test_elastic_resume_across_an_append_deals_the_rest_of_the_old_version(dataset):
    root, day2 = dataset

    def make(rank: int, world_size: int) -> StreamingDataLoader:
        options = StreamOptions(output="dict", rank=rank, world_size=world_size)
        return StreamingDataLoader(
            StreamingDataset(root, seed=4, batch_size=2, decode="raw", options=options)
        )

    ranks = [make(rank, 2) for rank in range(2)]
    consumed = [key for loader in ranks for key in keys_of(itertools.islice(loader, 3))]
    state = ranks[0].state_dict()  # the same on every rank
    build_shards(day2, root, append=True, **BUILD)
    alone = make(0, 1)  # restarted on one rank: elastic
    alone.load_state_dict(state)
    rest = keys_of(alone)
    old = keys_of(StreamingDataLoader(_make(root, version=1)))
    assert sorted(consumed + rest) == sorted(old)  # every version-1 sample once, none of day 2
    assert len(keys_of(alone)) == 34  # the next epoch: version 2
