"""Cleaning a dataset on S3: exclude, dups, attach, a view by fields, compact and prune all
work on a prefix as on a folder."""

from __future__ import annotations

from typing import Any

import pandas as pd

from shardstream import (
    StreamingDataset,
    StreamOptions,
    attach_columns,
    build_shards,
    compact_dataset,
    exclude_samples,
    find_duplicates,
    make_view,
    read_manifest,
)
from shardstream._catalog.versions import prune_versions
from shardstream._storage import Store
from tests.s3.s3env import BUCKET
from tests.streaming.shards import keys_of, tiny_jpeg


def test_exclude_dups_attach_where_compact_and_prune_on_s3(
    storage_options: dict[str, Any], moto_fs: Any
) -> None:
    train, test = f"s3://{BUCKET}/train", f"s3://{BUCKET}/test"
    samples = [{"__key__": f"t{i:03d}", "jpg": tiny_jpeg(i % 20), "cls": 0} for i in range(40)]
    build_shards(samples, train, max_samples_per_shard=8, storage_options=storage_options)
    build_shards([{"__key__": "v0", "jpg": tiny_jpeg(3), "cls": 0}], test,
                 storage_options=storage_options)  # fmt: skip
    report = find_duplicates([train, test], storage_options=storage_options)
    assert report.groups == 20 and report.crossing_groups == 1 and report.leaked == [2, 1]
    exclude_samples(train, [f"t{i:03d}" for i in range(20, 40)], storage_options=storage_options)
    assert find_duplicates([train, test], storage_options=storage_options).groups == 1
    attach_columns(train, pd.DataFrame({"__key__": ["t001", "t002"], "score": [5.0, 1.0]}),
                   storage_options=storage_options)  # fmt: skip
    view = f"s3://{BUCKET}/good"
    make_view(train, view, where="score > 2", storage_options=storage_options)
    options = StreamOptions(output="dict", storage_options=storage_options)
    good = list(StreamingDataset(view, decode="raw", options=options))
    assert [(s["__key__"], s["score"]) for s in good] == [("t001", 5.0)]
    compact_dataset(train, storage_options=storage_options)
    store = Store(train, storage_options)
    assert prune_versions(store, keep=1) == [1, 2, 3]
    moto_fs.invalidate_cache()
    assert not moto_fs.exists(f"{BUCKET}/train/shard-000003.tar")
    kept = keys_of(StreamingDataset(train, decode="raw", options=options))
    assert sorted(kept) == [f"t{i:03d}" for i in range(20)]
    assert read_manifest(train, storage_options).columns is not None
