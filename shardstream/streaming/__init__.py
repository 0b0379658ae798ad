"""Streaming half: the dataset, its loader, random access, mixtures and GPU decoding.

``StreamingDataset`` is the entry point (it needs torch); ``StreamingDataLoader`` adds
checkpointable positions. Names are imported lazily, so the torch-free parts
(:mod:`shardstream.streaming.planning`) import without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardstream.catalog.shardlist import ShardSpec, resolve_source
    from shardstream.streaming.dataset import StreamingDataset
    from shardstream.streaming.decoding.gpudecode import GpuDecode
    from shardstream.streaming.loader import StreamingDataLoader
    from shardstream.streaming.mixture import Stream
    from shardstream.streaming.options import StreamOptions
    from shardstream.streaming.randomaccess import RandomAccessDataset

__all__ = [
    "GpuDecode",
    "RandomAccessDataset",
    "ShardSpec",
    "Stream",
    "StreamOptions",
    "StreamingDataLoader",
    "StreamingDataset",
    "resolve_source",
]

_LAZY = {
    "GpuDecode": "shardstream.streaming.decoding.gpudecode",
    "RandomAccessDataset": "shardstream.streaming.randomaccess",
    "ShardSpec": "shardstream.catalog.shardlist",
    "Stream": "shardstream.streaming.mixture",
    "StreamOptions": "shardstream.streaming.options",
    "StreamingDataLoader": "shardstream.streaming.loader",
    "StreamingDataset": "shardstream.streaming.dataset",
    "resolve_source": "shardstream.catalog.shardlist",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardstream.streaming' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
