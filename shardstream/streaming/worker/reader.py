"""One worker's shard reader: open a run of samples of any shard, with its caches and limits.

A DataLoader worker makes one :class:`ShardReader` per pass. It holds what the worker keeps
between pieces (indexes, walked offsets, idle local file handles; see :mod:`.handles`) and the
read settings, so the rest of the worker asks only for ``open(shard, first, stop)``.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Iterator
from typing import Any

from shardstream.errors import ShardFormatError, StorageError
from shardstream.format.tarreader import DEFAULT_MAX_MEMBER_BYTES, is_gzip_name
from shardstream.streaming.shardlist import ShardList
from shardstream.streaming.worker.handles import HandlePool, IndexCache, OffsetIndex
from shardstream.streaming.worker.pieces import read_piece

__all__ = ["ReadSettings", "ShardReader", "WorkerStats"]

logger = logging.getLogger("shardstream.streaming")


@dataclasses.dataclass(frozen=True)
class ReadSettings:
    """How a worker reads shards.

    Attributes:
        max_member_bytes: Largest tar member read into memory.
        memory_map: Read indexed local shards through memory maps.
        on_error: ``"raise"``, or ``"skip"`` broken samples (counted, never shifting batches).
        tag_streams: Add ``__stream__`` (the shard's store number) to every sample (mixtures).
        max_idle_handles: Idle local file handles kept open between pieces.
    """

    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    memory_map: bool = True
    on_error: str = "raise"
    tag_streams: bool = False
    max_idle_handles: int = 64


@dataclasses.dataclass
class WorkerStats:
    """What one worker counted in a pass."""

    skipped: int = 0
    batches: int = 0


class ShardReader:
    """Opens runs of samples of a dataset's shards for one worker.

    Args:
        shards: The dataset's shards.
        settings: Read settings.
        stats: Where skipped samples are counted.

    Example:
        >>> reader = ShardReader(shards, ReadSettings())  # doctest: +SKIP
        >>> samples = list(reader.open(3, 0, 8))  # doctest: +SKIP
        >>> reader.close()  # doctest: +SKIP
    """

    def __init__(
        self, shards: ShardList, settings: ReadSettings, stats: WorkerStats | None = None
    ) -> None:
        self.shards, self.settings = shards, settings
        self.stats = stats if stats is not None else WorkerStats()
        idle = settings.max_idle_handles
        self._pools = [HandlePool(store, max_idle=idle) for store in shards.stores]
        self._indexes = [IndexCache(store) for store in shards.stores]
        self._walked = OffsetIndex()

    def open(self, shard: int, first: int, stop: int | None) -> Iterator[Any]:
        """Samples ``[first, stop)`` of shard number ``shard`` (``None``: to its end).

        With ``on_error="skip"`` a broken shard ends the run in ``None`` placeholders (one per
        missing sample, so batch boundaries do not move) and the samples are counted.
        """
        spec = self.shards.spec(shard)
        offsets = None
        if spec.index is not None and not is_gzip_name(spec.name):
            offsets = self._indexes[spec.store].get(spec.index, spec.num_samples, spec.num_bytes)
        settings = self.settings
        samples = read_piece(
            self._pools[spec.store], spec.name, first, stop, self._walked, offsets,
            settings.max_member_bytes, settings.memory_map,
        )  # fmt: skip
        if settings.tag_streams:
            samples = _tagged(samples, spec.store)
        if settings.on_error != "skip":
            return samples  # errors propagate as they are: no layer to pass through
        return self._guarded(samples, None if stop is None else stop - first)

    def _guarded(self, samples: Iterator[Any], count: int | None) -> Iterator[Any]:
        produced = 0
        try:
            for sample in samples:
                produced += 1
                yield sample
        except (ShardFormatError, StorageError) as error:
            missing = 1 if count is None else count - produced
            self.stats.skipped += missing
            logger.warning("skipping %d sample(s): %s", missing, error)
            if count is not None:
                yield from itertools.repeat(None, count - produced)

    def close(self) -> None:
        """Close every idle handle (handles still lent are closed when given back)."""
        for pool in self._pools:
            pool.close()


def _tagged(samples: Iterator[Any], stream: int) -> Iterator[Any]:
    for sample in samples:
        sample["__stream__"] = stream
        yield sample
