"""Excluding samples in place: a new version that leaves them out of every reader (exact
epochs at any ranks and workers, resume, views, mixtures, random access, inspect, verify),
while older versions read as before and no shard byte changes."""

from __future__ import annotations

import collections
import json
import logging
import pathlib
import subprocess
import sys

import pytest

from shardstream import (
    ConfigError,
    RandomAccessDataset,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
    build_shards,
    make_view,
    read_manifest,
)
from shardstream._catalog.exclude import exclude_samples
from shardstream._catalog.versions import read_version
from shardstream._format.verify import verify_dataset
from shardstream._storage import Store
from shardstream.streaming import Stream
from tests.shardwriter.helpers import dataset_bytes
from tests.streaming.shards import keys_of, make_samples

NUM = 120
ALL = [f"s{i:06d}" for i in range(NUM)]
#: Spread over the shards (16 samples each), and the whole of shard 2 (s000032 .. s000047).
GONE = ["s000000", "s000005", "s000015", "s000063", "s000100", "s000119", "s000118",
        *(f"s{i:06d}" for i in range(32, 48))]  # fmt: skip
KEPT = sorted(set(ALL) - set(GONE))  # 97 samples


@pytest.fixture(scope="module")
def excluded(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("exclude") / "ds"
    build_shards(make_samples(NUM), root, max_samples_per_shard=16)
    exclude_samples(root, GONE)
    return root


def _keys(root: pathlib.Path, world: int, workers: int, shuffle: bool, **kwargs) -> list[list]:
    """Every rank's keys of one epoch (ranks given as options: they never talk)."""
    per_rank = []
    for rank in range(world):
        options = StreamOptions(output="dict", rank=rank, world_size=world)
        dataset = StreamingDataset(root, shuffle=shuffle, batch_size=4, decode="raw",
                                   options=options, policy="drop", **kwargs)  # fmt: skip
        per_rank.append(keys_of(StreamingDataLoader(dataset, num_workers=workers)))
    return per_rank


@pytest.mark.parametrize("world", [1, 4])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle", [False, True])
def test_every_epoch_reads_each_kept_key_once_at_any_ranks_and_workers(
    excluded: pathlib.Path, world: int, workers: int, shuffle: bool
) -> None:
    per_rank = _keys(excluded, world, workers, shuffle)
    counted = collections.Counter(key for keys in per_rank for key in keys)
    dropped = len(KEPT) % world  # policy="drop": fewer than world_size left out, equal ranks
    assert len({len(keys) for keys in per_rank}) == 1
    assert set(counted.values()) == {1} and len(counted) == len(KEPT) - dropped
    assert set(counted) <= set(KEPT) and not set(counted) & set(GONE)


def test_the_old_version_reads_as_before_and_no_shard_changed(
    excluded: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    manifest = read_manifest(excluded)
    assert manifest.version == 2 and manifest.num_samples == len(KEPT)
    assert manifest.exclusions is not None and len(manifest.exclusions) == len(GONE)
    assert manifest.shards[2].num_samples == 0  # a whole shard left out: counted as empty
    old = StreamingDataset(excluded, version=1, decode="raw", options=StreamOptions(output="dict"))
    assert sorted(keys_of(old)) == ALL
    fresh = tmp_path / "fresh"
    build_shards(make_samples(NUM), fresh, max_samples_per_shard=16)
    shards = {name: data for name, data in dataset_bytes(fresh).items() if name.startswith("s")}
    assert {name: dataset_bytes(excluded)[name] for name in shards} == shards
    assert verify_dataset(excluded).num_samples == len(KEPT)


def test_random_access_names_the_version_that_excluded_a_key(excluded: pathlib.Path) -> None:
    dataset = RandomAccessDataset(excluded, decode="raw", options=StreamOptions(output="dict"))
    assert len(dataset) == len(KEPT)
    assert sorted(dataset[i]["__key__"] for i in range(len(dataset))) == KEPT
    assert dataset.by_key("s000001")["__key__"] == "s000001"
    with pytest.raises(KeyError, match="excluded from the dataset in version 2"):
        dataset.by_key("s000063")
    with pytest.raises(KeyError) as missing:
        dataset.by_key("never-there")
    assert "excluded" not in str(missing.value)
    old = RandomAccessDataset(excluded, version=1, decode="raw")
    assert len(old) == NUM


def test_views_and_mixtures_leave_excluded_samples_out(
    excluded: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    view = make_view(excluded, tmp_path / "half", fraction=0.5, seed=1)
    keys = keys_of(StreamingDataset(tmp_path / "half", decode="raw",
                                    options=StreamOptions(output="dict")))  # fmt: skip
    assert len(keys) == view.num_samples == len(set(keys)) and not set(keys) & set(GONE)
    assert verify_dataset(tmp_path / "half").num_samples == view.num_samples
    other = tmp_path / "other"
    build_shards(
        [{"__key__": f"o{i}", "jpg": sample["jpg"], "cls": 0, "json": {}}
         for i, sample in enumerate(make_samples(20))], other, max_samples_per_shard=8,
    )  # fmt: skip
    mixed = StreamingDataset([Stream(str(excluded)), Stream(str(other))], decode="raw",
                             batch_size=5, options=StreamOptions(output="dict"))  # fmt: skip
    counted = collections.Counter(keys_of(StreamingDataLoader(mixed, num_workers=2)))
    assert set(counted.values()) == {1} and set(counted) == set(KEPT) | {f"o{i}" for i in range(20)}
    with pytest.raises(ConfigError, match="is a view"):
        exclude_samples(tmp_path / "half", ["s000001"])


def test_shard_keys_and_positions_name_samples_and_a_rerun_publishes_nothing(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(40), root, max_samples_per_shard=16)
    with caplog.at_level(logging.WARNING):
        second = exclude_samples(root, shard_keys=[("shard-000001.tar", "s000020"),
                                                   ("shard-000001.tar", "s000001")])  # fmt: skip
    assert second.num_samples == 39  # s000001 is in shard 0, not 1: logged, not excluded
    assert "1 of the 2 keys" in caplog.text and "'s000001'" in caplog.text
    third = exclude_samples(root, positions=[0, 20, 38])  # of version 2 (s000020 gone)
    assert third.version == 3 and third.num_samples == 36
    kept = sorted(keys_of(StreamingDataset(root, decode="raw",
                                           options=StreamOptions(output="dict"))))  # fmt: skip
    gone = {"s000000", "s000020", "s000021", "s000039"}  # position 20 is s000021
    assert kept == sorted({f"s{i:06d}" for i in range(40)} - gone)
    again = exclude_samples(root, positions=[0, 20, 38])  # the same request, run again
    assert again.version == 3 and read_manifest(root).version == 3
    assert exclude_samples(root, ["s000000"]).version == 3  # already excluded: nothing new
    with pytest.raises(ConfigError, match=r"no shard named 'shard-000009\.tar'"):
        exclude_samples(root, shard_keys=[("shard-000009.tar", "s000001")])
    with pytest.raises(ConfigError, match="outside version 3's 36 samples"):
        exclude_samples(root, positions=[36])


def test_a_resumed_epoch_finishes_on_its_version_and_the_next_reads_the_new_one(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(48), root, max_samples_per_shard=8)

    def loader() -> StreamingDataLoader:
        dataset = StreamingDataset(root, seed=3, batch_size=4, decode="raw",
                                   options=StreamOptions(output="dict"))  # fmt: skip
        return StreamingDataLoader(dataset, num_workers=2)

    first = loader()
    iterator = iter(first)
    head = [key for _ in range(3) for key in next(iterator)["__key__"]]
    state = json.loads(json.dumps(first.state_dict()))
    del iterator
    gone = [f"s{i:06d}" for i in range(0, 48, 5)]
    exclude_samples(root, gone)
    resumed = loader()
    resumed.load_state_dict(state)
    rest = keys_of(resumed)
    assert collections.Counter(head + rest) == collections.Counter(f"s{i:06d}" for i in range(48))
    following = keys_of(resumed)  # the next epoch: the new version
    assert sorted(following) == sorted({f"s{i:06d}" for i in range(48)} - set(gone))


def test_cli_exclude_inspect_and_keys_files(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(40), root, max_samples_per_shard=16)
    keys = tmp_path / "keys.txt"
    keys.write_text("s000003\ns000004\n\nnot-a-key\n")

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "shardstream", *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    done = run("exclude", str(root), "--keys", str(keys))
    assert done.returncode == 0, done.stderr
    assert "version 1 -> 2: 40 -> 38 samples (2 excluded" in done.stdout
    assert "1 of the 3 keys" in done.stderr
    shown = run("inspect", str(root)).stdout
    assert "samples:  38 (40 stored, 2 excluded" in shown
    assert "version 1: 40 samples" in shown
    assert "version 2: 38 samples in 3 shards, 2 excluded by it" in shown
    mixed = tmp_path / "mixed.txt"
    mixed.write_text("shard-000000.tar\ts000001\ns000002\n")
    refused = run("exclude", str(root), "--keys", str(mixed))
    assert refused.returncode == 1 and "use one form for the whole file" in refused.stderr
    assert run("exclude", str(root), "--keys", str(keys)).stdout.endswith(
        "nothing excluded; version 2 stays published\n"
    )
    assert read_version(Store(str(root)), 1).num_samples == 40
