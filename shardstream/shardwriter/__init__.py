"""The shard writer: pack image folders, CSV/JSONL lists or sample iterables into tar shards,
and describe shards made by other tools (:func:`index_shards`).

Example:
    >>> from shardstream.shardwriter import build_shards
    >>> manifest = build_shards("data/train", "shards/train", workers=4)  # doctest: +SKIP
"""

from __future__ import annotations

from shardstream.format.verify import verify_dataset
from shardstream.shardwriter.build import ProgressCallback, build_shards
from shardstream.shardwriter.indexer import IndexOptions, index_shards
from shardstream.shardwriter.options import BuildOptions
from shardstream.shardwriter.partitions import merge_partitions, write_partition
from shardstream.shardwriter.views import make_view, split_dataset

__all__ = [
    "BuildOptions",
    "IndexOptions",
    "ProgressCallback",
    "build_shards",
    "index_shards",
    "make_view",
    "merge_partitions",
    "split_dataset",
    "verify_dataset",
    "write_partition",
]
