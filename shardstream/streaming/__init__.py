"""Streaming half: the dataset, its loader, random access, mixtures, GPU decoding, and checks
that a resume (and an evaluation) counts every sample as it should.

``StreamingDataset`` is the entry point (it needs torch); ``StreamingDataLoader`` adds
checkpointable positions. The names listed in ``__all__`` are the public ones; everything with
a leading underscore is private and may move. The private modules here wire; the work is in
private folders, each importing only those before it: ``_planning/`` (torch-free, I/O-free
formulas of the epoch's order), ``_decoding/`` (samples to training values, GPU decoding),
``_worker/`` (what one DataLoader worker runs), ``_control/`` (which pass a process reads, the
resume state) and ``_diagnostics/`` (statistics, ``shardstream bench``). Names are imported
lazily, so the torch-free parts import without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardstream._catalog.shardlist import ShardSpec, resolve_source
    from shardstream.streaming._checks import AuditReport, ResumeAudit, check_position
    from shardstream.streaming._control.position import Position
    from shardstream.streaming._dataset import StreamingDataset
    from shardstream.streaming._decoding.gpudecode import GpuDecode
    from shardstream.streaming._diagnostics.stats import LoaderStats
    from shardstream.streaming._lightning import LoaderPositionCheck
    from shardstream.streaming._loader import StreamingDataLoader
    from shardstream.streaming._options import Stream, StreamOptions
    from shardstream.streaming._randomaccess import EvaluationPart, RandomAccessDataset

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
    "AuditReport": "shardstream.streaming._checks",
    "EvaluationPart": "shardstream.streaming._randomaccess",
    "GpuDecode": "shardstream.streaming._decoding.gpudecode",
    "LoaderPositionCheck": "shardstream.streaming._lightning",  # imports lightning
    "LoaderStats": "shardstream.streaming._diagnostics.stats",
    "Position": "shardstream.streaming._control.position",
    "RandomAccessDataset": "shardstream.streaming._randomaccess",
    "ResumeAudit": "shardstream.streaming._checks",
    "check_position": "shardstream.streaming._checks",
    "ShardSpec": "shardstream._catalog.shardlist",
    "Stream": "shardstream.streaming._options",
    "StreamOptions": "shardstream.streaming._options",
    "StreamingDataLoader": "shardstream.streaming._loader",
    "StreamingDataset": "shardstream.streaming._dataset",
    "resolve_source": "shardstream._catalog.shardlist",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'shardstream.streaming' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def __dir__() -> list[str]:
    return sorted(__all__)
