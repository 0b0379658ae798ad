"""The shard writer: pack image folders, CSV/JSONL lists or sample iterables into tar shards.

Indexing other tools' shards (:func:`index_shards`), views and merges are named here too, as
at the top level (``shardstream.index_shards``). The names in ``__all__`` are the public ones;
the modules with a leading underscore are private and may move.

Examples:
    >>> from shardstream.shardwriter import build_shards
    >>> manifest = build_shards("data/train", "shards/train", workers=4)  # doctest: +SKIP
"""

from __future__ import annotations

# The catalog's operations are also named here, where they were before the catalog package.
from shardstream._catalog.execute import merge_partitions
from shardstream._catalog.indexer import IndexOptions, index_shards
from shardstream._catalog.views import make_view, split_dataset
from shardstream._format.verify import verify_dataset
from shardstream.shardwriter._build import ProgressCallback, build_shards, write_partition
from shardstream.shardwriter._compact import compact_dataset
from shardstream.shardwriter._tasks import BuildOptions

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
