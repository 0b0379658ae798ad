"""What a user meets first: reprs that say what an object is, modes checked when it is made, and
credentials passed the same way to every entry point."""

from __future__ import annotations

import pathlib

import pytest

from shardstream import (
    ConfigError,
    RandomAccessDataset,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
    build_shards,
)


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    dest = tmp_path_factory.mktemp("front") / "ds"
    samples = ({"__key__": f"s{i:03d}", "txt": b"x", "cls": i % 3} for i in range(12))
    build_shards(samples, dest, max_samples_per_shard=5)
    return dest


def test_reprs_say_where_how_many_and_how(dataset: pathlib.Path) -> None:
    ds = StreamingDataset(dataset, decode="raw", batch_size=4, seed=7)
    text = repr(ds)
    assert str(dataset) in text and "12 samples in 3 shards" in text, text
    assert "seed=7" in text and "batch_size=4" in text and "decode='raw'" in text, text
    loader = StreamingDataLoader(ds, num_workers=0)
    assert repr(loader).startswith("StreamingDataLoader(StreamingDataset(") and (
        "num_workers=0" in repr(loader)
    )
    assert "12 samples in 3 shards" in repr(RandomAccessDataset(dataset, decode="raw"))


def test_an_unknown_decode_mode_is_refused_when_the_dataset_is_made(
    dataset: pathlib.Path,
) -> None:
    with pytest.raises(ConfigError, match=r"'rgb8'.*'cuda'.*got 'rbg8'"):
        StreamingDataset(dataset, decode="rbg8")
    with pytest.raises(ConfigError, match="got 'rbg8'"):
        RandomAccessDataset(dataset, decode="rbg8")


def test_storage_options_are_a_plain_argument_too(dataset: pathlib.Path) -> None:
    given = {"anon": True}
    ds = StreamingDataset(dataset, decode="raw", storage_options=given)
    assert ds.options.storage_options == given
    assert RandomAccessDataset(dataset, storage_options=given).options.storage_options == given
    same = StreamOptions(storage_options=given)
    assert StreamingDataset(dataset, options=same, storage_options=given).options == same
    with pytest.raises(ConfigError, match="storage_options was given twice"):
        StreamingDataset(dataset, options=StreamOptions(storage_options={"anon": False}),
                         storage_options=given)  # fmt: skip
