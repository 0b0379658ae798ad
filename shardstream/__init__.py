"""shardstream: build WebDataset tar shards and stream them into PyTorch.

Two halves share one manifest format:

- :func:`build_shards` (``shardstream.shardwriter``) packs an image folder, a CSV/JSONL list or
  any iterable of samples into tar shards plus ``manifest.json``; it needs no torch.
- :class:`StreamingDataset` (``shardstream.streaming``) streams shards into a DataLoader with
  exact, equal, resumable epochs across ranks and workers; it needs torch.

Names are imported lazily, so ``import shardstream`` stays cheap and the writer never imports
torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from shardstream._format.manifest import Manifest, ShardInfo, read_manifest
from shardstream._storage import ReadOptions, Store
from shardstream._version import __version__
from shardstream.errors import (
    ChecksumMismatchError,
    ConfigError,
    DatasetExistsError,
    DecodeError,
    DuplicateKeyError,
    ManifestError,
    ManifestNotFoundError,
    ResumeError,
    ShardFormatError,
    ShardNotFoundError,
    ShardstreamError,
    SourceError,
    StorageError,
)

if TYPE_CHECKING:
    from shardstream._catalog import (
        IndexOptions,
        attach_columns,
        exclude_samples,
        find_duplicates,
        index_shards,
        make_view,
        merge_partitions,
        split_dataset,
    )
    from shardstream._format.inspection import write_timm_info
    from shardstream._format.verify import verify_dataset
    from shardstream.shardwriter import (
        BuildOptions,
        build_shards,
        compact_dataset,
        write_partition,
    )
    from shardstream.streaming import (
        GpuDecode,
        LoaderPositionCheck,
        LoaderStats,
        RandomAccessDataset,
        ResumeAudit,
        Stream,
        StreamingDataLoader,
        StreamingDataset,
        StreamOptions,
        check_position,
    )


__all__ = [
    "BuildOptions",
    "ChecksumMismatchError",
    "ConfigError",
    "DatasetExistsError",
    "DecodeError",
    "DuplicateKeyError",
    "GpuDecode",
    "IndexOptions",
    "LoaderPositionCheck",
    "LoaderStats",
    "Manifest",
    "ManifestError",
    "ManifestNotFoundError",
    "RandomAccessDataset",
    "ReadOptions",
    "ResumeAudit",
    "ResumeError",
    "ShardFormatError",
    "ShardInfo",
    "ShardNotFoundError",
    "ShardstreamError",
    "SourceError",
    "StorageError",
    "Store",
    "Stream",
    "StreamOptions",
    "StreamingDataLoader",
    "StreamingDataset",
    "__version__",
    "attach_columns",
    "build_shards",
    "check_position",
    "compact_dataset",
    "exclude_samples",
    "find_duplicates",
    "index_shards",
    "make_view",
    "merge_partitions",
    "read_manifest",
    "split_dataset",
    "verify_dataset",
    "write_partition",
    "write_timm_info",
]

_LAZY = {
    "BuildOptions": "shardstream.shardwriter",
    "attach_columns": "shardstream._catalog",
    "build_shards": "shardstream.shardwriter",
    "compact_dataset": "shardstream.shardwriter",
    "exclude_samples": "shardstream._catalog",
    "find_duplicates": "shardstream._catalog",
    "IndexOptions": "shardstream._catalog",
    "index_shards": "shardstream._catalog",
    "make_view": "shardstream._catalog",
    "merge_partitions": "shardstream._catalog",
    "split_dataset": "shardstream._catalog",
    "write_partition": "shardstream.shardwriter",
    "verify_dataset": "shardstream._format.verify",
    "write_timm_info": "shardstream._format.inspection",
    "LoaderPositionCheck": "shardstream.streaming",  # imports lightning when first used
    "LoaderStats": "shardstream.streaming",
    "GpuDecode": "shardstream.streaming",
    "RandomAccessDataset": "shardstream.streaming",
    "ResumeAudit": "shardstream.streaming",
    "check_position": "shardstream.streaming",
    "Stream": "shardstream.streaming",
    "StreamOptions": "shardstream.streaming",
    "StreamingDataLoader": "shardstream.streaming",
    "StreamingDataset": "shardstream.streaming",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardstream' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    """The public names (lazy ones included), so ``dir()`` and tab completion list them."""
    return sorted(set(__all__) | set(globals()))
