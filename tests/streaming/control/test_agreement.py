"""How ranks agree on a growing dataset's version, without processes: the process group's store
is a dict with the same compare-and-set (first value posted under a key wins), and each rank
keeps its own count of the datasets it made, as separate processes do."""

from __future__ import annotations

import collections
import pathlib

import pytest

from shardstream.errors import ConfigError
from shardstream.shardwriter import build_shards
from shardstream.streaming import StreamingDataset, StreamOptions
from shardstream.streaming._control import versionset as agreement
from tests.shardwriter.growth import write_day

BUILD = {"max_samples_per_shard": 3}


class _Store:
    """``post_first`` over a dict (the first value per key), and each rank's own counts."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.held: dict[str, str] = {}
        self._ranks: dict[int, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self._monkeypatch = monkeypatch

    def post(self, key: str, value: str) -> str:
        return self.held.setdefault(key, value)

    def settle(self, dataset: StreamingDataset, rank: int) -> str | None:
        self._monkeypatch.setattr(agreement, "_made", self._ranks[rank])
        return agreement.settle(dataset.versions, self.post, rank)


def _grow(tmp_path: pathlib.Path, root: pathlib.Path, day: int) -> None:
    build_shards(write_day(tmp_path / f"day{day}", day, per_class=1), root, append=day > 1,
                 **BUILD)  # fmt: skip


def _make(root: pathlib.Path, **kwargs: object) -> StreamingDataset:
    return StreamingDataset(root, decode="raw", options=StreamOptions(output="dict"), **kwargs)


def test_each_rank_reads_the_version_the_first_rank_posted(tmp_path, monkeypatch) -> None:
    root, store = tmp_path / "ds", _Store(monkeypatch)
    _grow(tmp_path, root, 1)
    first = _make(root)
    key = store.settle(first, rank=1)  # rank 1 makes it first
    _grow(tmp_path, root, 2)  # an append lands before rank 0 makes its own
    second = _make(root)
    assert second.version == 2
    assert store.settle(second, rank=0) == key
    assert first.version == second.version == 1 and len(second) == len(first)
    # A refresh: the first rank to look posts the newest; the other follows it.
    assert agreement.refresh(first.versions, store.post, f"{key}/refresh/1", rank=1) == 2
    _grow(tmp_path, root, 3)  # published before rank 0 refreshes
    assert agreement.refresh(second.versions, store.post, f"{key}/refresh/1", rank=0) == 2


def test_datasets_match_by_how_many_of_the_source_each_rank_made(tmp_path, monkeypatch) -> None:
    root, store = tmp_path / "ds", _Store(monkeypatch)
    _grow(tmp_path, root, 1)
    rank0 = [store.settle(_make(root), rank=0) for _ in range(2)]
    rank1 = [store.settle(_make(root), rank=1) for _ in range(2)]
    assert rank0 == rank1 and rank0[0] != rank0[1]  # the n-th dataset of one source on each


def test_a_rank_that_cannot_follow_says_which_versions(tmp_path, monkeypatch) -> None:
    root, store = tmp_path / "ds", _Store(monkeypatch)
    _grow(tmp_path, root, 1)
    _grow(tmp_path, root, 2)
    store.settle(_make(root), rank=0)  # posts version 2
    pinned = _make(root, version=1)
    with pytest.raises(ConfigError, match=r"rank 1 was made with version=1, but the job's first"):
        store.settle(pinned, rank=1)


def test_without_a_process_group_nothing_is_posted(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "ds"
    _grow(tmp_path, root, 1)
    dataset = _make(root)
    assert agreement.settle(dataset.versions, lambda key, value: None, rank=0) is None
    assert dataset.version == 1
