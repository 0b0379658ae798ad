"""Random access by position and by key returns exactly the bytes that streaming yields."""

from __future__ import annotations

import pathlib
import random
from typing import Any

import pytest
import torch.utils.data

from shardstream import ConfigError, RandomAccessDataset, StreamOptions, build_shards
from shardstream.streaming import StreamingDataLoader, StreamingDataset
from tests.streaming.shards import make_samples

LOOKUPS = 1000


def streamed_by_key(source: str, **options: Any) -> dict[str, dict[str, Any]]:
    """Every sample as one streaming epoch yields it (raw bytes), by key."""
    dataset = StreamingDataset(
        source, batch_size=None, decode="raw", options=StreamOptions(output="dict", **options)
    )
    samples = {sample["__key__"]: sample for sample in StreamingDataLoader(dataset)}
    assert len(samples) == len(dataset)
    return samples


def check_random_access(source: str, seed: int = 0, **options: Any) -> RandomAccessDataset:
    """1,000 random positions and 1,000 random keys give the streamed samples' bytes."""
    streamed = streamed_by_key(source, **options)
    ds = RandomAccessDataset(source, decode="raw", options=StreamOptions(output="dict", **options))
    assert len(ds) == len(streamed)
    rng = random.Random(seed)
    for position in (rng.randrange(-len(ds), len(ds)) for _ in range(LOOKUPS)):
        sample = ds[position]
        assert sample == streamed[sample["__key__"]]
        assert ds.index_of(sample["__key__"]) == position % len(ds)
    keys = sorted(streamed)
    for key in (rng.choice(keys) for _ in range(LOOKUPS)):
        assert ds.by_key(key) == streamed[key]
    return ds


def test_positions_and_keys_read_the_streamed_bytes(tmp_path: pathlib.Path) -> None:
    build_shards(make_samples(1200), tmp_path / "ds", max_samples_per_shard=97)
    ds = check_random_access(str(tmp_path / "ds"))
    assert [ds[i]["__key__"] for i in range(len(ds))] == [f"s{i:06d}" for i in range(1200)]
    assert check_random_access(str(tmp_path / "ds"), seed=1, memory_map=False) is not None
    with pytest.raises(IndexError, match="position 1200 of a dataset of 1200"):
        ds[1200]
    with pytest.raises(KeyError):
        ds.by_key("nobody")


def test_a_dataloader_with_workers_and_any_sampler_reads_it(tmp_path: pathlib.Path) -> None:
    build_shards(make_samples(60), tmp_path / "ds", max_samples_per_shard=7)
    ds = RandomAccessDataset(str(tmp_path / "ds"), decode="raw",
                             options=StreamOptions(output="dict"))  # fmt: skip
    sampler = torch.utils.data.RandomSampler(ds, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)
    keys = [key for batch in loader for key in batch["__key__"]]
    assert sorted(keys) == [f"s{i:06d}" for i in range(60)] and keys != sorted(keys)


def test_shards_without_a_manifest_are_refused_with_the_fix(tmp_path: pathlib.Path) -> None:
    build_shards(make_samples(10), tmp_path / "ds", max_samples_per_shard=5)
    pattern = str(tmp_path / "ds" / "shard-{000000..000001}.tar")
    with pytest.raises(ConfigError, match="shardstream index"):
        RandomAccessDataset(pattern)


def test_a_broken_sample_is_not_told_to_pass_an_on_error_it_has_not(
    tmp_path: pathlib.Path,
) -> None:
    from shardstream import DecodeError, ShardFormatError
    from tests.conftest import encode_image

    samples = [{"__key__": f"k{i}", "jpg": encode_image(16, 16, i), "cls": 0} for i in range(8)]
    samples[2]["jpg"] = b"\xff\xd8\xff\xe0" + b"\0" * 200 + b"\xff\xd9"  # markers, no image
    build_shards(samples, tmp_path / "ds", max_samples_per_shard=4)
    ds = RandomAccessDataset(tmp_path / "ds")
    with pytest.raises(DecodeError, match=r"'k2'.*does not decode") as decoding:
        ds.by_key("k2")
    shard = tmp_path / "ds" / "shard-000001.tar"
    shard.write_bytes(shard.read_bytes()[:3000])  # truncated
    with pytest.raises(ShardFormatError, match=r"shard-000001\.tar") as reading:
        [ds.raw(position) for position in range(len(ds))]
    for error in (decoding.value, reading.value):
        assert str(error).endswith(("Rebuild the shard.", "Re-copy or rebuild it.")), error
        assert "on_error" not in str(error) and "after key ''" not in str(error), error
