"""The default order on S3: long reads (a request costs 10-50 ms on real stores), exact epochs."""

from __future__ import annotations

from typing import Any

from shardstream import build_shards
from shardstream._format.manifest import read_manifest
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET

SAMPLE_BYTES = 20_000


def test_default_order_reads_s3_in_requests_of_over_a_mebibyte(
    storage_options: dict[str, Any], proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    url = f"s3://{BUCKET}/order/ds"
    samples = (
        {"__key__": f"k{i:05d}", "bin": bytes([i % 251]) * SAMPLE_BYTES, "cls": i // 400}
        for i in range(1600)
    )
    build_shards(samples, url, storage_options=storage_options, max_samples_per_shard=400)
    data_bytes = read_manifest(url, storage_options).num_bytes
    options = StreamOptions(output="dict", storage_options=proxy_options)
    dataset = StreamingDataset(url, decode="raw", batch_size=64, options=options)
    settings = dataset.settings
    assert settings.order.piece_size * settings.facts.mean_sample_bytes >= 2 << 20  # 2 MiB pieces
    fault_proxy.clear()
    loader = StreamingDataLoader(dataset, num_workers=2)
    keys = [key for batch in loader for key in batch["__key__"]]
    assert sorted(keys) == [f"k{i:05d}" for i in range(1600)]
    tar_gets = fault_proxy.count("GET", ".tar")
    assert tar_gets and data_bytes / tar_gets >= 1 << 20, f"{tar_gets} GETs of {data_bytes} B"
    # and the batches still mix: the 4 classes (one per shard) all appear in most batches
    labels = [set(batch) for batch in _labels(dataset)]
    assert sum(len(batch) >= 3 for batch in labels) >= 0.8 * len(labels)


def _labels(dataset: StreamingDataset) -> list[list[int]]:
    return [[int(key[1:]) // 400 for key in batch["__key__"]] for batch in dataset]
