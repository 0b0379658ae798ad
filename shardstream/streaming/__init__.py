"""Streaming half: shard lists, epoch plans, tar reading, shuffling, decoding, the dataset.

Needs torch. ``StreamingDataset`` is the entry point; ``StreamingDataLoader`` adds checkpointable
positions.
"""

from __future__ import annotations

from shardstream.streaming.dataset import StreamingDataset
from shardstream.streaming.loader import StreamingDataLoader
from shardstream.streaming.mixture import Stream
from shardstream.streaming.options import StreamOptions
from shardstream.streaming.shardlist import ShardSpec, resolve_source

__all__ = [
    "ShardSpec",
    "Stream",
    "StreamOptions",
    "StreamingDataLoader",
    "StreamingDataset",
    "resolve_source",
]
