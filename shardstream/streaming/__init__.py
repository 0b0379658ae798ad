"""Streaming half: the dataset, its loader, random access, mixtures, GPU decoding, and checks
that a resume (and an evaluation) counts every sample as it should.

``StreamingDataset`` is the entry point (it needs torch); ``StreamingDataLoader`` adds
checkpointable positions. The modules here wire; the work is in folders, each importing only
those before it: ``planning/`` (torch-free, I/O-free formulas of the epoch's order),
``decoding/`` (samples to training values, GPU decoding), ``worker/`` (what one DataLoader
worker runs), ``control/`` (which pass a process reads, the resume state) and ``diagnostics/``
(statistics, ``shardstream bench``). Names are imported lazily, so the torch-free parts import
without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardstream.catalog.shardlist import ShardSpec, resolve_source
    from shardstream.streaming.control.position import Position
    from shardstream.streaming.dataset import StreamingDataset
    from shardstream.streaming.decoding.gpudecode import GpuDecode
    from shardstream.streaming.diagnostics.stats import LoaderStats
    from shardstream.streaming.lightningcallback import LoaderPositionCheck
    from shardstream.streaming.loader import StreamingDataLoader
    from shardstream.streaming.mixture import Stream
    from shardstream.streaming.options import StreamOptions
    from shardstream.streaming.randomaccess import EvaluationPart, RandomAccessDataset
    from shardstream.streaming.resumeaudit import AuditReport, ResumeAudit
    from shardstream.streaming.resumecheck import check_position

__all__ = [
    "AuditReport",
    "EvaluationPart",
    "GpuDecode",
    "LoaderPositionCheck",
    "LoaderStats",
    "Position",
    "RandomAccessDataset",
    "ResumeAudit",
    "ShardSpec",
    "Stream",
    "StreamOptions",
    "StreamingDataLoader",
    "StreamingDataset",
    "check_position",
    "resolve_source",
]

_LAZY = {
    "AuditReport": "shardstream.streaming.resumeaudit",
    "EvaluationPart": "shardstream.streaming.randomaccess",
    "GpuDecode": "shardstream.streaming.decoding.gpudecode",
    "LoaderPositionCheck": "shardstream.streaming.lightningcallback",  # imports lightning
    "LoaderStats": "shardstream.streaming.diagnostics.stats",
    "Position": "shardstream.streaming.control.position",
    "RandomAccessDataset": "shardstream.streaming.randomaccess",
    "ResumeAudit": "shardstream.streaming.resumeaudit",
    "check_position": "shardstream.streaming.resumecheck",
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
