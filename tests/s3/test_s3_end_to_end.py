"""Build a dataset to S3 and stream it back with faults injected mid-shard."""

from __future__ import annotations

import json
import logging
import pathlib
from collections.abc import Callable
from typing import Any

import pytest

from shardstream._storage import ReadOptions, Store
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET, SECRET_KEY

pytest.importorskip("torch")
DEST = f"s3://{BUCKET}/datasets/train"
FAST = ReadOptions(max_attempts=4, backoff_s=0.01, max_backoff_s=0.05, timeout_s=1.0)


def keys_and_labels(options: dict[str, Any], read_options: ReadOptions) -> list[Any]:
    from shardstream.streaming import StreamingDataset, StreamOptions

    dataset = StreamingDataset(
        DEST, seed=3, decode="raw", options=StreamOptions(
            output="dict", storage_options=options, read_options=read_options, num_open=4,
            piece_size=4, chunk_size=0,  # whole shards in pieces of 4: the GETs the rules count
        ),
    )  # fmt: skip
    return [
        (sample["__key__"], sorted((k, v) for k, v in sample.items() if isinstance(v, bytes)))
        for sample in dataset
    ]


@pytest.mark.usefixtures("store_latency")
def test_build_to_s3_then_stream_with_faults_mid_shard(
    make_image_folder: Callable[..., pathlib.Path],
    storage_options: dict[str, Any],
    proxy_options: dict[str, Any],
    fault_proxy: FaultProxy,
    moto_fs: Any,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from shardstream import build_shards

    caplog.set_level(logging.INFO)
    images = make_image_folder(num_classes=3, per_class=10, size=(64, 48))
    manifest = build_shards(images, DEST, storage_options=storage_options, max_samples_per_shard=8)
    names = Store(DEST, storage_options).list_names()
    assert "manifest.json" in names and len(manifest.shards) == 4
    assert SECRET_KEY not in moto_fs.cat_file(f"{DEST}/manifest.json").decode()
    expected = keys_and_labels(proxy_options, FAST)
    assert len(expected) == 30
    fault_proxy.clear()
    rules = [
        fault_proxy.add(
            method="GET", path_contains=".tar", nth=2, action="reset", after_bytes=5000
        ),
        fault_proxy.add(method="GET", path_contains=".tar", nth=5, action="cut", after_bytes=7000),
        fault_proxy.add(method="GET", path_contains=".tar", nth=7, action="503"),
    ]
    assert keys_and_labels(proxy_options, FAST) == expected
    assert all(rule.hits == 1 for rule in rules)
    assert SECRET_KEY not in caplog.text
    assert SECRET_KEY not in json.dumps(manifest.settings, default=str)
