"""Exact duplicates within and across datasets, from indexes: every planted group and leak is
found and no other, the keys file `exclude` takes leaves them out, and the answer is the same
in one bucket or many, in this process, on processes or on Dask, and for old indexes."""

from __future__ import annotations

import collections
import hashlib
import json
import pathlib
import subprocess
import sys

import pytest
import webdataset as wds

from shardstream import build_shards, index_shards
from shardstream._catalog.dups import find_duplicates
from shardstream._catalog.exclude import exclude_samples
from shardstream._cli.edit import read_key_lines
from shardstream._format.shardindex import decode_index, encode_offsets
from tests.conftest import encode_image
from tests.daskcluster import dask_client


def _train_and_test() -> tuple[list[dict], list[dict]]:
    """Real JPEGs; train holds groups {1, 10, 20, 30} and {50, 51}; test's 3 copies train's
    60 and test's 4 copies train's 1 (under other keys and labels: the same image)."""
    train = [{"__key__": f"train/{i:03d}", "jpg": encode_image(20, 16, seed=i), "cls": i % 3}
             for i in range(120)]  # fmt: skip
    for i in (10, 20, 30):
        train[i]["jpg"] = train[1]["jpg"]
    train[51]["jpg"] = train[50]["jpg"]
    test = [{"__key__": f"test/{i:03d}", "jpg": encode_image(20, 16, seed=1000 + i), "cls": 0}
            for i in range(30)]  # fmt: skip
    test[3]["jpg"], test[4]["jpg"] = train[60]["jpg"], train[1]["jpg"]
    return train, test


def _expected(*datasets: list[dict]) -> list[set[tuple[int, str]]]:
    """The groups, computed from the images' bytes apart from shardstream."""
    groups = collections.defaultdict(set)
    for number, samples in enumerate(datasets):
        for sample in samples:
            groups[hashlib.sha256(sample["jpg"]).digest()].add((number, sample["__key__"]))
    return sorted((group for group in groups.values() if len(group) > 1), key=sorted)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("dups")
    train, test = _train_and_test()
    build_shards(train, root / "train", max_samples_per_shard=16)
    build_shards(test, root / "test", max_samples_per_shard=16)
    return root


def test_every_planted_group_and_leak_is_found_and_no_other(built: pathlib.Path) -> None:
    train, test = _train_and_test()
    expected = _expected(train, test)
    assert len(expected) == 3
    report = find_duplicates([built / "train", built / "test"], examples=10)
    assert report.groups == 3 and report.crossing_groups == 2 and report.largest == 5
    assert report.in_groups == [7, 2] and report.beyond_first == [4, 2] and report.leaked == [5, 2]
    shown = sorted(({(0 if "train" in m["dataset"] else 1, m["key"]) for m in example["members"]}
                    for example in report.examples), key=sorted)  # fmt: skip
    assert shown == expected
    alone = find_duplicates([built / "test"])
    assert alone.groups == 0 and alone.examples == [] and alone.in_groups == [0]


def test_more_buckets_and_processes_give_the_same_answer(built: pathlib.Path) -> None:
    one = find_duplicates([built / "train", built / "test"], examples=10)
    many = find_duplicates([built / "train", built / "test"], examples=10, workers=2,
                           max_bucket_bytes=256)  # fmt: skip
    assert many.as_dict() == one.as_dict()


def test_keys_files_drop_the_extra_copies_or_the_leaks(
    built: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    train = tmp_path / "train"
    build_shards(_train_and_test()[0], train, max_samples_per_shard=16)
    extra, leaked = tmp_path / "extra.txt", tmp_path / "leaked.txt"
    find_duplicates([train, built / "test"], keys_out=extra)
    report = find_duplicates([train, built / "test"], keys_out=leaked, drop="leaked")
    assert report.keys_written == 5
    _, pairs = read_key_lines(str(extra))
    assert sorted(key for _, key in pairs or []) == ["train/010", "train/020", "train/030",
                                                      "train/051"]  # fmt: skip
    _, pairs = read_key_lines(str(leaked))
    assert sorted(key for _, key in pairs or []) == ["train/001", "train/010", "train/020",
                                                      "train/030", "train/060"]  # fmt: skip
    exclude_samples(train, shard_keys=pairs)
    after = find_duplicates([train, built / "test"])  # the new version: excluded samples left out
    assert after.datasets[0]["samples"] == 115 and after.groups == 1 and after.leaked == [0, 0]


def test_old_indexes_and_foreign_shards_give_the_same_groups(tmp_path: pathlib.Path) -> None:
    train, test = _train_and_test()
    old = tmp_path / "old"
    manifest = build_shards(train, old, max_samples_per_shard=16)
    for shard in manifest.shards[::2]:  # every other index back to version 2: no digests
        path = old / (shard.index or "")
        index = decode_index(path.read_bytes(), "x")
        path.write_bytes(encode_offsets(index.offsets, index.key_hashes))
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    with wds.ShardWriter(str(foreign / "part-%05d.tar"), maxcount=8) as sink:
        for sample in test:
            sink.write(sample)
    index_shards(foreign)
    report = find_duplicates([old, foreign], examples=10)
    assert [item["read_whole"] for item in report.datasets] == [4, 0]
    assert report.groups == 3 and report.leaked == [5, 2]


@pytest.mark.slow
def test_dups_run_on_a_dask_cluster(built: pathlib.Path, tmp_path: pathlib.Path) -> None:
    local = find_duplicates([built / "train", built / "test"], max_bucket_bytes=512)
    with dask_client() as client:
        dask = find_duplicates(
            [built / "train", built / "test"], max_bucket_bytes=512, workers=2,
            executor=client.get_executor(), work_dir=str(tmp_path / "work"),
        )  # fmt: skip
    assert dask.as_dict() == local.as_dict()


def test_cli_dups_prints_groups_and_json(built: pathlib.Path, tmp_path: pathlib.Path) -> None:
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "shardstream", "dups", *argv]
        return subprocess.run(command, capture_output=True, text=True, timeout=120)

    text = run(str(built / "train"), str(built / "test"), "--keys-out", str(tmp_path / "k.txt"))
    assert text.returncode == 0, text.stderr
    assert "groups:   3 of equal content (largest 5); 2 span datasets" in text.stdout
    assert "120 samples, 7 in groups, 4 beyond the first of each, 5 also in another" in text.stdout
    assert "4 line(s) in" in text.stdout and "shardstream exclude" in text.stdout
    document = json.loads(run(str(built / "train"), "--json").stdout)
    assert document["groups"] == 2 and document["crossing_groups"] == 0
