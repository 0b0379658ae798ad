"""Appending to a dataset: new shards after the old ones, a new version published last."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from shardstream._catalog.versions import list_versions, prune_versions, read_version
from shardstream._cli.common import human
from shardstream._format.manifest import read_manifest
from shardstream._format.verify import find_problems
from shardstream._storage import Store
from shardstream.errors import (
    ConfigError,
    DatasetExistsError,
    ManifestNotFoundError,
    SourceError,
)
from shardstream.shardwriter import build_shards

from .growth import write_day
from .helpers import dataset_bytes, read_with_webdataset

OPTIONS = {"max_samples_per_shard": 3}


@pytest.fixture
def grown(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A dataset built from day 1, and day 2's tree (not appended yet)."""
    dest = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1), dest, **OPTIONS)
    return dest, write_day(tmp_path / "day2", 2, per_class=3)


def test_append_continues_numbering_and_keeps_old_shards(grown):
    dest, day2 = grown
    before = dataset_bytes(dest)
    manifest = build_shards(day2, dest, append=True, **OPTIONS)
    assert manifest.version == 2 and manifest.num_samples == 8 + 6
    names = [shard.name for shard in manifest.shards]
    assert names == [f"shard-{number:06d}.tar" for number in range(len(names))]
    after = dataset_bytes(dest)
    for name, data in before.items():  # old shards, indexes and the v1 manifest: untouched
        if name not in ("manifest.json", "_info.json"):
            assert after[name] == data, name
    assert after["manifest.v000001.json"] == before["manifest.json"]
    assert after["manifest.json"] == after["manifest.v000002.json"]
    old = read_version(Store(str(dest)), 1)
    assert list(manifest.shards)[: len(old.shards)] == list(old.shards)
    keys = sorted(sample["__key__"] for sample in read_with_webdataset(dest))
    assert len(keys) == 14 and sum("day2" in key for key in keys) == 6
    assert find_problems(Store(str(dest)), manifest) == []


def test_rerun_of_a_finished_append_publishes_nothing(grown):
    dest, day2 = grown
    build_shards(day2, dest, append=True, **OPTIONS)
    finished = dataset_bytes(dest)
    again = build_shards(day2, dest, append=True, **OPTIONS)
    assert again.version == 2 and dataset_bytes(dest) == finished


def test_appending_an_older_versions_source_again_is_refused(grown, tmp_path):
    dest, day2 = grown
    build_shards(day2, dest, append=True, **OPTIONS)
    build_shards(write_day(tmp_path / "day3", 3, per_class=1), dest, append=True, **OPTIONS)
    before = dataset_bytes(dest)
    for source, version in ((tmp_path / "day1", 1), (day2, 2)):
        with pytest.raises(SourceError, match=rf"version {version} of .* already holds this"):
            build_shards(source, dest, append=True, **OPTIONS)
    prune_versions(Store(str(dest)), keep=1)  # the history is in the newest version too
    with pytest.raises(SourceError, match=r"version 2 of .* already holds this source"):
        build_shards(day2, dest, append=True, resize=16, **OPTIONS)
    after = dataset_bytes(dest)
    assert {name: after[name] for name in before if name in after} == after
    assert read_manifest(str(dest)).version == 3


def test_second_append_and_old_versions_stay_readable_until_pruned(grown, tmp_path):
    dest, day2 = grown
    build_shards(day2, dest, append=True, **OPTIONS)
    build_shards(write_day(tmp_path / "day3", 3, per_class=1), dest, append=True, **OPTIONS)
    store = Store(str(dest))
    assert list_versions(store) == [1, 2, 3]
    counts = [read_version(store, version).num_samples for version in (1, 2, 3)]
    assert counts == [8, 14, 16] and read_manifest(store).version == 3
    assert prune_versions(store, keep=2) == [1]
    assert list_versions(store) == [2, 3]
    with pytest.raises(ManifestNotFoundError, match=r"no version 1 .*\[2, 3\]"):
        read_version(store, 1)
    assert find_problems(store, read_manifest(store)) == []  # no shard was removed


def test_append_of_nothing_publishes_nothing(grown, tmp_path, caplog):
    dest, _ = grown
    before = dataset_bytes(dest)
    empty = tmp_path / "empty"
    (empty / "class_00").mkdir(parents=True)
    manifest = build_shards(empty, dest, append=True, **OPTIONS)
    assert manifest.version == 1 and dataset_bytes(dest) == before
    assert "nothing appended" in caplog.text


def test_append_refuses_other_member_extensions(grown, tmp_path):
    dest, _ = grown
    listing = tmp_path / "list.csv"
    first, second = sorted((tmp_path / "day1").rglob("*.jpg"))[:2]
    listing.write_text(f"path,label,caption\n{first},class_00,a cat\n{second},class_01,a dog\n")
    before = dataset_bytes(dest)
    expected = r"members \['cls', 'jpg', 'json'\], but .* \['an image', 'cls'\]"
    with pytest.raises(SourceError, match=expected):
        build_shards(listing, dest, append=True, **OPTIONS)
    assert dataset_bytes(dest) == before and not (dest / "_shardstream_build").exists()


def test_append_refuses_other_labels(grown, tmp_path):
    dest, _ = grown
    other = write_day(tmp_path / "three", 4, num_classes=3)
    with pytest.raises(SourceError, match=r"class 2 is None in the dataset but 'class_02'"):
        build_shards(other, dest, append=True, **OPTIONS)
    renamed = tmp_path / "renamed"
    write_day(renamed, 5)
    (renamed / "class_01").rename(renamed / "dogs")
    with pytest.raises(SourceError, match=r"class 1 is 'class_01' in the dataset but 'dogs'"):
        build_shards(renamed, dest, append=True, **OPTIONS)


def test_append_refuses_a_jpeg_dataset_getting_pngs(tmp_path):
    dest = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1), dest, resize=16, **OPTIONS)
    with pytest.raises(SourceError, match=r"day2_0002.png: .*\['cls', 'jpg'\]"):
        build_shards(write_day(tmp_path / "day2", 2), dest, append=True, **OPTIONS)
    manifest = build_shards(tmp_path / "day2", dest, append=True, resize=16, **OPTIONS)
    assert manifest.version == 2


def test_append_refuses_a_shard_name_clash(grown):
    dest, day2 = grown
    (dest / "shard-000003.tar").write_bytes(b"someone else's")
    with pytest.raises(DatasetExistsError, match=r"shard-000003.tar: exists already"):
        build_shards(day2, dest, append=True, **OPTIONS)
    assert (dest / "shard-000003.tar").read_bytes() == b"someone else's"
    assert read_manifest(str(dest)).version == 1


def test_append_refuses_other_shard_formats_views_and_missing_datasets(grown, tmp_path):
    dest, day2 = grown
    with pytest.raises(ManifestNotFoundError, match="holds no dataset to append to"):
        build_shards(day2, tmp_path / "nothing", append=True)
    from shardstream.shardwriter import make_view

    make_view(dest, tmp_path / "view", fraction=0.5)
    with pytest.raises(ConfigError, match="is a view"):
        build_shards(day2, tmp_path / "view", append=True)
    with pytest.raises(ConfigError, match="append and overwrite"):
        build_shards(day2, dest, append=True, overwrite=True)
    document = json.loads((dest / "manifest.json").read_text())
    for entry in document["shards"]:
        entry["index"] = None
    (dest / "manifest.json").write_text(json.dumps(document))
    with pytest.raises(SourceError, match="another shard format"):
        build_shards(day2, dest, append=True)


def test_view_records_the_version_it_was_made_from(grown, tmp_path):
    from shardstream.shardwriter import make_view

    dest, day2 = grown
    build_shards(day2, dest, append=True, **OPTIONS)
    view = make_view(dest, tmp_path / "view", fraction=0.5)
    assert view.view is not None and view.view["source_version"] == 2


def test_cli_append_inspect_versions_and_prune(grown):
    dest, day2 = grown
    cli = [sys.executable, "-m", "shardstream"]

    def run(*args: str) -> str:
        done = subprocess.run([*cli, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    out = run("build", str(day2), str(dest), "--append", "--max-samples-per-shard", "3", "-q")
    assert "version 2: 14 samples" in out
    listing = run("inspect", str(dest))
    assert "version 1: 8 samples in 3 shards" in listing
    assert "version 2: 14 samples in 5 shards (published)" in listing
    assert "samples:  8" in run("inspect", str(dest), "--at-version", "1")
    assert "removed versions none" in run("prune", str(dest))  # the default keeps 2 versions
    build_shards(write_day(dest.parent / "day3", 3, per_class=1), dest, append=True, **OPTIONS)
    listed = run("prune", str(dest), "--keep", "1", "--dry-run")
    assert "would remove versions [1, 2] (2 files, " in listed and "readable versions [3]" in listed
    sizes = {name: (dest / name).stat().st_size for name in ("manifest.v000001.json",
                                                             "manifest.v000002.json")}  # fmt: skip
    for name, size in sizes.items():
        assert f"  {name}  {human(size)}\n" in listed
    assert all((dest / name).exists() for name in sizes)
    assert "removed versions [1] (1 file," in run("prune", str(dest))
    assert [(dest / name).exists() for name in sizes] == [False, True]
    done = subprocess.run([*cli, "inspect", str(dest), "--at-version", "1"], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    assert done.returncode == 1 and "has no version 1" in done.stderr


def test_append_to_a_dataset_with_a_binary_shard_table(grown, monkeypatch):
    from shardstream._format import manifest as manifest_module

    dest, day2 = grown
    monkeypatch.setattr(manifest_module, "INLINE_MAX_SHARDS", 2)  # format 2 from 3 shards on
    build_shards(day2, dest, append=True, **OPTIONS)
    names = sorted(p.name for p in dest.glob("manifest*"))
    assert names == ["manifest.json", "manifest.v000001.json", "manifest.v000002.json",
                     "manifest.v000002.shards"]  # fmt: skip
    assert json.loads((dest / "manifest.json").read_text())["shard_table"]["name"] == (
        "manifest.v000002.shards"
    )
    store = Store(str(dest))
    assert read_version(store, 1).num_samples == 8 and read_manifest(store).num_samples == 14
    prune_versions(store, keep=1)
    assert find_problems(store, read_manifest(store)) == []
    assert sorted(p.name for p in dest.glob("manifest*")) == names[:1] + names[2:]


def test_finished_append_leaves_another_appends_unfinished_state_alone(grown, tmp_path):
    dest, day2 = grown
    build_shards(day2, dest, append=True, **OPTIONS)
    state_folder = dest / "_shardstream_build"
    state_folder.mkdir()
    (state_folder / "plan.json").write_text('{"source_path": "elsewhere"}')
    assert build_shards(day2, dest, append=True, **OPTIONS).version == 2
    assert (state_folder / "plan.json").exists()


def test_pruning_version_1_of_a_binary_table_dataset_removes_its_table(tmp_path, monkeypatch):
    from shardstream._format import manifest as manifest_module

    monkeypatch.setattr(manifest_module, "INLINE_MAX_SHARDS", 2)
    dest = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1), dest, **OPTIONS)
    assert (dest / "manifest.shards").exists()
    build_shards(write_day(tmp_path / "day2", 2), dest, append=True, **OPTIONS)
    store = Store(str(dest))
    assert read_version(store, 1).num_samples == 8  # still through manifest.shards
    assert prune_versions(store) == []  # the default keeps the version before the newest
    assert prune_versions(store, keep=1) == [1]
    assert not (dest / "manifest.shards").exists()
    assert find_problems(store, read_manifest(store)) == []
