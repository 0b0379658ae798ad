"""Loader statistics count the storage retries that faults on a real S3 server cause."""

from __future__ import annotations

from typing import Any

import pytest

from shardstream import StreamingDataLoader, StreamingDataset, StreamOptions, build_shards
from shardstream._storage import ReadOptions
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET
from tests.streaming.shards import make_samples

FAST = ReadOptions(max_attempts=4, backoff_s=0.01, max_backoff_s=0.05, timeout_s=1.0)


@pytest.mark.usefixtures("store_latency")
def test_retries_and_bytes_are_counted(
    storage_options: dict[str, Any], proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    url = f"s3://{BUCKET}/stats/ds"
    build_shards(make_samples(40), url, storage_options=storage_options,
                 max_samples_per_shard=10)  # fmt: skip
    fault_proxy.clear()
    fault_proxy.add(method="GET", path_contains=".tar", nth=2, action="503", times=2)
    options = StreamOptions(stats=True, storage_options=proxy_options, read_options=FAST)
    loader = StreamingDataLoader(StreamingDataset(url, batch_size=4, decode="raw", options=options))
    assert sum(len(batch[1]) for batch in loader) == 40
    stats = loader.stats()
    assert stats["retries"] == 2 and stats["read_samples"] == 40
    assert stats["bytes"] >= sum(len(s["jpg"]) for s in make_samples(40))
