"""What the default epoch order depends on, known to every rank from the manifest.

Plain data (no I/O, no imports of storage), so the torch-free, I/O-free order formulas in
:mod:`shardstream.streaming.planning.order` take it as it is, and
:meth:`~shardstream.catalog.shardlist.ShardList.facts` fills it in from the shard list.
"""

from __future__ import annotations

import dataclasses

__all__ = ["DatasetFacts"]


@dataclasses.dataclass(frozen=True)
class DatasetFacts:
    """What the default order depends on, known to every rank from the manifest.

    Attributes:
        indexed: Every shard has a per-sample byte index (pieces can start anywhere).
        local: Every shard is on a local file system, or kept whole in a local cache that
            holds all of the remote ones (``ReadOptions(cache_dir=...)``): no request per read.
        mean_sample_bytes: Average bytes per sample (shard bytes / samples), 0 if unknown.
        mean_shard_bytes: Average bytes per shard, 0 if unknown.
    """

    indexed: bool
    local: bool
    mean_sample_bytes: float
    mean_shard_bytes: float = 0.0
