"""Random access on the S3 test server: the streamed bytes, one ranged GET per lookup."""

from __future__ import annotations

from typing import Any

from shardstream import RandomAccessDataset, StreamOptions, build_shards
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET
from tests.streaming.shards import make_samples
from tests.streaming.test_random_access import check_random_access


def test_positions_and_keys_on_s3_read_the_streamed_bytes(
    storage_options: dict[str, Any], proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    url = f"s3://{BUCKET}/random/ds"
    build_shards(make_samples(1200), url, storage_options=storage_options,
                 max_samples_per_shard=150)  # fmt: skip
    check_random_access(url, storage_options=storage_options)
    options = StreamOptions(output="dict", storage_options=proxy_options)
    ds = RandomAccessDataset(url, decode="raw", options=options)
    assert ds[5]["__key__"] == "s000005"  # reads shard 0's index once
    fault_proxy.clear()
    for position in (17, 149, 3, 77):
        assert ds[position]["__key__"] == f"s{position:06d}"
    gets = [target for method, target in fault_proxy.requests if method == "GET"]
    assert len(gets) == 4 and all("shard-000000.tar" in target for target in gets)
