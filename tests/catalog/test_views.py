"""Views: a 10% subset, a 90/10 split and a key list stream exactly their samples, resumably,
without a byte of the source rewritten."""

from __future__ import annotations

import collections
import pathlib

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
    split_dataset,
)
from shardstream._format.exclusions import key_draws
from shardstream._format.keys import key_hash
from shardstream._format.verify import verify_dataset
from tests.shardwriter.helpers import dataset_bytes
from tests.streaming.shards import keys_of, make_samples

NUM = 1000
ALL = [f"s{i:06d}" for i in range(NUM)]


def _drawn(keys: list[str], low: float, high: float, seed: int) -> set[str]:
    """The keys whose seeded draw lies in [low, high), computed apart from the view code."""
    import numpy as np

    draws = key_draws(np.array([key_hash(k) for k in keys], dtype=np.int64), seed)
    return {k for k, d in zip(keys, draws, strict=True) if low <= d < high}


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder = tmp_path_factory.mktemp("views") / "all"
    build_shards(make_samples(NUM), folder, max_samples_per_shard=64)
    return folder


def _loader(root: pathlib.Path, batch_size: int = 10) -> StreamingDataLoader:
    ds = StreamingDataset(root, batch_size=batch_size, options=StreamOptions(output="dict"))
    return StreamingDataLoader(ds, num_workers=2)


def test_a_ten_percent_view_streams_exactly_its_samples_and_resumes(
    source: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    before = dataset_bytes(source)
    view = make_view(source, tmp_path / "tenth", fraction=0.1, seed=7)
    expected = _drawn(ALL, 0.0, 0.1, seed=7)
    assert 60 < len(expected) < 140 and view.num_samples == len(expected)
    assert sorted(p.name for p in (tmp_path / "tenth").iterdir()) == ["manifest.json"]
    loader = _loader(tmp_path / "tenth")
    assert len(loader.dataset) == -(-len(expected) // 10)  # type: ignore[arg-type]  # batches
    assert sorted(keys_of(loader)) == sorted(expected)
    iterator = iter(loader)
    head = [k for _ in range(3) for k in next(iterator)["__key__"]]
    state = loader.state_dict()
    del iterator
    restored = _loader(tmp_path / "tenth")
    restored.load_state_dict(state)
    rest = keys_of(restored)
    assert collections.Counter(head + rest) == collections.Counter(expected)
    assert verify_dataset(tmp_path / "tenth").num_samples == len(expected)
    assert dataset_bytes(source) == before


def test_a_ninety_ten_split_puts_every_key_on_one_side(
    source: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    views = split_dataset(source, tmp_path / "split", {"train": 0.9, "val": 0.1}, seed=3)
    train = set(keys_of(_loader(tmp_path / "split" / "train")))
    val = set(keys_of(_loader(tmp_path / "split" / "val")))
    assert train == _drawn(ALL, 0.0, 0.9, seed=3) and val == _drawn(ALL, 0.9, 1.0, seed=3)
    assert not train & val and train | val == set(ALL)
    assert views["train"].num_samples == len(train) and 50 < len(val) < 150
    again = split_dataset(source, tmp_path / "again", {"train": 0.9, "val": 0.1}, seed=3)
    assert again["val"].shards == views["val"].shards  # the same seed: the same split


def test_a_key_list_view_reads_by_position_and_key(
    source: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    wanted = ["s000003", "s000500", "s000999", "s000064", "s000063"]
    make_view(source, tmp_path / "few", keys=[*wanted, "not-in-the-data"])
    assert sorted(keys_of(_loader(tmp_path / "few", batch_size=2))) == sorted(wanted)
    ds = RandomAccessDataset(tmp_path / "few", options=StreamOptions(output="dict"))
    assert sorted(ds[i]["__key__"] for i in range(len(ds))) == sorted(wanted)
    assert ds.by_key("s000500")["json"] == {"index": 500}
    assert read_manifest(tmp_path / "few").view is not None


def test_views_of_views_and_unknown_rules_are_refused(
    source: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    make_view(source, tmp_path / "half", fraction=0.5)
    with pytest.raises(ConfigError, match="is a view"):
        make_view(tmp_path / "half", tmp_path / "quarter", fraction=0.5)
    with pytest.raises(ConfigError, match="exactly one"):
        make_view(source, tmp_path / "x", fraction=0.5, keys=["s000001"])


def test_a_view_never_replaces_a_datasets_manifest(
    source: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    from shardstream import DatasetExistsError

    other = tmp_path / "other"
    build_shards(make_samples(12), other, max_samples_per_shard=5)
    before = (other / "manifest.json").read_bytes()
    said = r"other: holds a dataset \(12 samples, version 1\), not a view; its manifest would be"
    with pytest.raises(DatasetExistsError, match=said):
        make_view(source, other, fraction=0.5)
    with pytest.raises(DatasetExistsError, match=said):
        make_view(source, other, keys=["s000001"])
    with pytest.raises(DatasetExistsError, match=said):  # no split written before the refusal
        split_dataset(source, tmp_path, {"zfirst": 0.5, "other": 0.5})
    assert not (tmp_path / "zfirst").exists()
    with pytest.raises(DatasetExistsError, match="holds a dataset"):
        make_view(source, source, fraction=0.5)  # the source itself
    assert (other / "manifest.json").read_bytes() == before
    assert read_manifest(source).view is None
    make_view(source, tmp_path / "half", fraction=0.5)  # a view is made again in place
    assert make_view(source, tmp_path / "half", fraction=0.25).num_samples < NUM * 0.4
