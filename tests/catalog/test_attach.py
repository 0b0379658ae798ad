"""Fields attached by key: a new version whose samples carry a table's fields (the tars
untouched), kept aligned through exclude, compact, prune and append; views by a predicate over
them read exactly their samples; a killed attach leaves the old or the new version."""

from __future__ import annotations

import collections
import logging
import multiprocessing
import os
import pathlib
import signal
import warnings
from collections.abc import Callable
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
import webdataset as wds

from shardstream import (
    ConfigError,
    RandomAccessDataset,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
    build_shards,
    index_shards,
    make_view,
    read_manifest,
)
from shardstream._catalog.attach import attach_columns
from shardstream._catalog.exclude import exclude_samples
from shardstream._catalog.versions import prune_versions
from shardstream._format.verify import verify_dataset
from shardstream._storage import Store
from shardstream._storage.backends.local import LocalBackend
from shardstream.shardwriter._compact import compact_dataset
from tests.shardwriter.growth import write_day
from tests.shardwriter.helpers import dataset_bytes, kill_at
from tests.streaming.shards import keys_of, make_samples

NUM = 64
SCORES = {f"s{i:06d}": (i % 10) / 2 for i in range(NUM) if i % 7}  # every 7th has no row
DICT = StreamOptions(output="dict")


def _table() -> pd.DataFrame:
    keys = sorted(SCORES)
    scores = [SCORES[key] for key in keys] + [9.0]
    captions = [f"caption of {key}" for key in keys] + ["x"]
    return pd.DataFrame({"__key__": [*keys, "not-a-key"], "aesthetic": scores, "caption": captions})


def _fields(root: pathlib.Path, workers: int = 2, **options: object) -> dict[str, tuple]:
    dataset = StreamingDataset(root, batch_size=5, decode="raw",
                               options=StreamOptions(output="dict", **options))  # fmt: skip
    found: dict[str, tuple] = {}
    for batch in StreamingDataLoader(dataset, num_workers=workers):
        for key, score, caption in zip(batch["__key__"], batch["aesthetic"], batch["caption"],
                                       strict=True):  # fmt: skip
            assert key not in found
            found[key] = (score, caption)
    return found


@pytest.fixture(scope="module")
def attached(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("attach") / "ds"
    build_shards(make_samples(NUM), root, max_samples_per_shard=10)
    attach_columns(root, _table())
    return root


def test_fields_arrive_in_batches_and_by_key_and_the_tars_stay(
    attached: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    found = _fields(attached)
    assert len(found) == NUM
    for key, (score, caption) in found.items():
        expected = (SCORES[key], f"caption of {key}") if key in SCORES else (None, None)
        assert (score, caption) == expected
    manifest = read_manifest(attached)
    assert manifest.version == 2 and manifest.columns is not None
    assert dict(manifest.columns.fields) == {"aesthetic": "double", "caption": "large_string"}
    one = RandomAccessDataset(attached, decode="raw", options=DICT).by_key("s000003")
    assert one["aesthetic"] == 1.5 and one["json"] == {"index": 3}
    fresh = tmp_path / "fresh"
    build_shards(make_samples(NUM), fresh, max_samples_per_shard=10)
    tars = {name: data for name, data in dataset_bytes(fresh).items() if name.endswith(".tar")}
    assert {name: dataset_bytes(attached)[name] for name in tars} == tars
    old = StreamingDataset(attached, version=1, decode="raw", options=DICT)
    assert "aesthetic" not in next(iter(old))


def test_csv_jsonl_and_arrow_tables_and_what_is_refused(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(20), root, max_samples_per_shard=8)
    (tmp_path / "a.csv").write_text("id,score\ns000001,3\ns000002,4\nmissing,5\n")
    with caplog.at_level(logging.WARNING):
        attach_columns(root, tmp_path / "a.csv", key="id")
    assert "1 of the table's 3 keys are in no shard" in caplog.text
    (tmp_path / "b.jsonl").write_text('{"__key__": "s000002", "flag": true}\n')
    attach_columns(root, tmp_path / "b.jsonl")  # a second table: the first's fields stay
    attach_columns(root, pa.table({"__key__": ["s000003"], "score": [7]}))  # replaces score
    sample = RandomAccessDataset(root, decode="raw", options=DICT).by_key("s000002")
    assert sample["flag"] is True and sample["score"] is None
    assert RandomAccessDataset(root, decode="raw", options=DICT).by_key("s000003")["score"] == 7
    for table, message in [
        (pd.DataFrame({"key": ["s000001"], "x": [1]}), "no key column '__key__'"),
        (pd.DataFrame({"__key__": ["s000001", "s000001"], "x": [1, 2]}), "twice"),
        (pd.DataFrame({"__key__": ["s000001"], "jpg": [1]}), "named like a sample's member"),
    ]:
        with pytest.raises(ConfigError, match=message):
            attach_columns(root, table)


def test_a_view_by_fields_reads_exactly_its_samples_at_any_ranks(
    attached: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    view = make_view(attached, tmp_path / "pretty", where="aesthetic >= 2.5 and caption != 'x'")
    wanted = {key for key, score in SCORES.items() if score >= 2.5}
    assert view.num_samples == len(wanted)
    for world in (1, 4):
        per_rank = []
        for rank in range(world):
            dataset = StreamingDataset(
                tmp_path / "pretty", batch_size=3, decode="raw", shuffle=True, policy="drop",
                options=StreamOptions(output="dict", rank=rank, world_size=world),
            )  # fmt: skip
            per_rank.append(keys_of(StreamingDataLoader(dataset, num_workers=2)))
        counted = collections.Counter(key for keys in per_rank for key in keys)
        assert set(counted.values()) == {1} and len({len(keys) for keys in per_rank}) == 1
        assert set(counted) <= wanted and len(counted) == len(wanted) - len(wanted) % world
    assert all(score >= 2.5 for score, _ in _fields(tmp_path / "pretty", workers=0).values())
    assert verify_dataset(tmp_path / "pretty").num_samples == len(wanted)
    with pytest.raises(KeyError, match="do not satisfy this view's predicate"):
        RandomAccessDataset(tmp_path / "pretty", decode="raw").by_key("s000001")
    with pytest.raises(ConfigError, match="no field 'nsfw'"):
        make_view(attached, tmp_path / "bad", where="nsfw == 1")
    with pytest.raises(ConfigError, match="is not allowed"):
        make_view(attached, tmp_path / "bad", where="open('x')")


def test_fields_stay_aligned_through_exclude_compact_prune_and_append(
    tmp_path: pathlib.Path,
) -> None:
    root = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1, per_class=10), root, max_samples_per_shard=4)
    keys = sorted(keys_of(StreamingDataset(root, decode="raw", options=DICT)))
    scores = {key: float(number) for number, key in enumerate(keys)}
    attach_columns(root, pd.DataFrame({"__key__": keys, "aesthetic": list(scores.values()),
                                       "caption": [f"caption of {k}" for k in keys]}))  # fmt: skip
    gone = keys[:2] + keys[9:10]
    exclude_samples(root, gone)
    compact_dataset(root)
    assert prune_versions(Store(str(root)), keep=1) == [1, 2, 3]
    assert sorted(path.name for path in (root / "columns").iterdir()) == ["v000002"]
    found = _fields(root)
    assert set(found) == set(keys) - set(gone)
    assert all(found[key] == (scores[key], f"caption of {key}") for key in found)
    build_shards(write_day(tmp_path / "day2", 2), root, append=True, max_samples_per_shard=4)
    grown = _fields(root)
    assert {key: value for key, value in grown.items() if key in found} == found
    assert {value for key, value in grown.items() if "day2" in key} == {(None, None)}
    assert len(grown) == len(found) + 8


def test_index_makes_foreign_shards_attachable(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "wds"
    folder.mkdir()
    with wds.ShardWriter(str(folder / "part-%05d.tar"), maxcount=8) as sink:
        for sample in make_samples(20):
            sink.write(sample)
    index_shards(folder)
    attach_columns(folder, pd.DataFrame({"__key__": ["s000005"], "aesthetic": [6.0]}))
    view = make_view(folder, tmp_path / "view", where="aesthetic > 5")
    assert view.num_samples == 1
    sample = next(iter(StreamingDataset(tmp_path / "view", decode="raw", options=DICT)))
    assert sample["__key__"] == "s000005" and sample["aesthetic"] == 6.0


def _named(fragment: str, at: int = 1) -> Callable[[tuple], bool]:
    """The call's argument ``at`` names ``fragment`` (os.replace's target: 1;
    ``LocalBackend.create_exclusive(backend, fs, path, ...)``'s path: 2)."""
    return lambda args: fragment in str(args[at])


#: name -> (object owning the patched function, its attribute, ``when(call_args)``, nth call).
KILL_POINTS: dict[str, tuple[Any, str, Callable[[tuple], bool], int]] = {
    "field-file": (os, "replace", _named("columns"), 3),
    "keep-version-1": (LocalBackend, "create_exclusive", _named("manifest.v000001.json", 2), 1),
    "versioned-manifest": (LocalBackend, "create_exclusive", _named("manifest.v000002.json", 2), 1),
    "manifest-not-renamed": (os, "replace", lambda args: str(args[1]).endswith("manifest.json"), 1),
}


def _attach_and_kill(root: pathlib.Path, point: str) -> None:
    """Forked child: attach, with a SIGKILL at the chosen write."""
    kill_at(*KILL_POINTS[point])
    attach_columns(root, _table())


@pytest.mark.parametrize("point", sorted(KILL_POINTS))
def test_a_killed_attach_leaves_a_whole_version_and_a_rerun_finishes(
    attached: pathlib.Path, tmp_path: pathlib.Path, point: str
) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(NUM), root, max_samples_per_shard=10)
    before = (root / "manifest.json").read_bytes()
    child = multiprocessing.get_context("fork").Process(target=_attach_and_kill, args=(root, point))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
        child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL
    assert (root / "manifest.json").read_bytes() == before
    assert "aesthetic" not in next(iter(StreamingDataset(root, decode="raw", options=DICT)))
    attach_columns(root, _table())
    assert (root / "manifest.json").read_bytes() == (attached / "manifest.json").read_bytes()
    assert _fields(root, workers=0) == _fields(attached, workers=0)
