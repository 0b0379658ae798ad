"""A stream on the local S3 server mixed with a local one, each with its own storage options."""

from __future__ import annotations

import collections
import pathlib
from typing import Any

from shardstream import Stream, StreamingDataLoader, StreamingDataset, StreamOptions, build_shards
from tests.s3.s3env import BUCKET
from tests.streaming.shards import keys_of, make_samples


def test_s3_stream_mixed_with_a_local_one(
    tmp_path: pathlib.Path, storage_options: dict[str, Any]
) -> None:
    remote = f"s3://{BUCKET}/mixture/web"
    web = [{**s, "__key__": "w" + s["__key__"]} for s in make_samples(40)]
    build_shards(web, remote, storage_options=storage_options, max_samples_per_shard=10)
    local = tmp_path / "curated"
    curated = [{**s, "__key__": "c" + s["__key__"]} for s in make_samples(9)]
    build_shards(curated, local, max_samples_per_shard=4)
    streams = [
        Stream(remote, proportion=0.7, storage_options=storage_options),
        Stream(str(local), proportion=0.3),
    ]
    dataset = StreamingDataset(
        streams, epoch_size=30, batch_size=5, options=StreamOptions(output="dict")
    )
    loader = StreamingDataLoader(dataset, num_workers=2)
    for _ in range(2):
        keys = keys_of(loader)
        assert collections.Counter(key[0] for key in keys) == {"w": 21, "c": 9}
    assert {key for key in keys if key[0] == "c"} == {f"cs{i:06d}" for i in range(9)}


def test_streams_without_their_own_options_take_the_datasets(
    tmp_path: pathlib.Path, storage_options: dict[str, Any]
) -> None:
    remote = f"s3://{BUCKET}/mixture/inherit"
    build_shards(make_samples(12), remote, storage_options=storage_options, max_samples_per_shard=5)
    options = StreamOptions(output="dict", storage_options=storage_options)
    dataset = StreamingDataset([Stream(remote, repeat=1.0)], batch_size=4, options=options)
    assert sorted(keys_of(StreamingDataLoader(dataset))) == [f"s{i:06d}" for i in range(12)]
