"""The shard writer: pack image folders, CSV/JSONL lists or sample iterables into tar shards.

Indexing other tools' shards (:func:`index_shards`), views and merges live in
:mod:`shardstream.catalog` and are re-exported here.

Examples:
    >>> from shardstream.shardwriter import build_shards
    >>> manifest = build_shards("data/train", "shards/train", workers=4)  # doctest: +SKIP
"""

from __future__ import annotations

# The catalog's operations are also named here, where they were before shardstream.catalog.
from shardstream.catalog.indexer import IndexOptions, index_shards
from shardstream.catalog.partitionmerge import merge_partitions
from shardstream.catalog.views import make_view, split_dataset
from shardstream.format.verify import verify_dataset
from shardstream.shardwriter.build import ProgressCallback, build_shards
from shardstream.shardwriter.compact import compact_dataset
from shardstream.shardwriter.options import BuildOptions
from shardstream.shardwriter.partitions import write_partition

__all__ = [
    "BuildOptions",
    "IndexOptions",
    "ProgressCallback",
    "build_shards",
    "compact_dataset",
    "index_shards",
    "make_view",
    "merge_partitions",
    "split_dataset",
    "verify_dataset",
    "write_partition",
]
