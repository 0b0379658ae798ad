"""The shard writer: pack image folders, CSV/JSONL lists or sample iterables into tar shards.

Example:
    >>> from shardstream.shardwriter import build_shards
    >>> manifest = build_shards("data/train", "shards/train", workers=4)  # doctest: +SKIP
"""

from __future__ import annotations

from shardstream.format.verify import verify_dataset
from shardstream.shardwriter.build import ProgressCallback, build_shards
from shardstream.shardwriter.options import BuildOptions

__all__ = ["BuildOptions", "ProgressCallback", "build_shards", "verify_dataset"]
