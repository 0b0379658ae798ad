"""``shardstream index`` on a folder that gained shards written by other tools."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import webdataset as wds

from shardstream import index_shards, read_manifest
from shardstream._catalog.versions import list_versions, read_version
from shardstream._format.verify import verify_dataset
from shardstream._storage import Store
from shardstream.errors import DatasetExistsError
from shardstream.shardwriter import build_shards
from tests.shardwriter.growth import write_day
from tests.streaming.shards import tiny_jpeg


def _write_shards(folder: pathlib.Path, first_shard: int, num_shards: int) -> None:
    """``webdataset.ShardWriter`` shards ``part-NNNNN.tar``, 4 samples each."""
    folder.mkdir(parents=True, exist_ok=True)
    pattern = str(folder / "part-%05d.tar")
    with wds.ShardWriter(pattern, maxcount=4, start_shard=first_shard) as sink:
        for i in range(4 * first_shard, 4 * (first_shard + num_shards)):
            sink.write({"__key__": f"img{i:05d}", "jpg": tiny_jpeg(i % 16), "cls": i % 3})


def _files(folder: pathlib.Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


def test_index_again_reads_only_the_new_shards(tmp_path):
    folder = tmp_path / "shards"
    _write_shards(folder, 0, 2)
    first = index_shards(folder)
    before = _files(folder)
    _write_shards(folder, 2, 2)  # another day's shards, named to sort after the others
    read: list[str] = []
    manifest = index_shards(folder, progress=lambda done, *_: read.append(str(done)))
    assert manifest.version == 2 and manifest.num_samples == 16
    assert read == ["0", "2"]  # the total at once, then the two new shards only
    assert list(manifest.shards)[:2] == list(first.shards)
    after = _files(folder)
    for name in ("part-00000.tar", "part-00000.idx", "part-00001.idx"):
        assert after[name] == before[name]
    assert after["manifest.v000001.json"] == before["manifest.json"]
    assert list_versions(Store(str(folder))) == [1, 2]
    assert read_version(Store(str(folder)), 1).num_samples == 8
    assert verify_dataset(folder) == manifest
    assert index_shards(folder) == manifest  # nothing new: nothing published
    assert read_manifest(folder).version == 2


def test_index_refuses_a_listing_that_no_longer_starts_with_the_indexed_shards(tmp_path):
    folder = tmp_path / "shards"
    _write_shards(folder, 1, 2)
    index_shards(folder)
    _write_shards(folder, 0, 1)  # sorts before the indexed shards
    with pytest.raises(DatasetExistsError, match=r"lists part-00001.tar as shard 0, .* part-00000"):
        index_shards(folder)
    assert index_shards(folder, overwrite=True).num_samples == 12


def test_index_refuses_a_built_dataset_and_names_append(tmp_path):
    dest = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1), dest)
    command = [sys.executable, "-m", "shardstream", "index", str(dest)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "--append" in done.stderr
