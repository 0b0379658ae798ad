"""Writing a planned build's chunks into DEST's build state, resuming what a killed run did."""

from __future__ import annotations

import concurrent.futures as cf
import logging
from collections.abc import Callable

import numpy as np

from shardstream.catalog.execute import run_tasks
from shardstream.shardwriter import state
from shardstream.shardwriter.options import BuildOptions
from shardstream.shardwriter.records import FileTable
from shardstream.shardwriter.tasks import ChunkResult, ChunkTask, write_chunk
from shardstream.storage import Store

__all__ = ["ProgressCallback", "Tracker", "write_chunks"]

logger = logging.getLogger("shardstream.shardwriter.build")

#: ``progress(items_done, source_bytes_done, total_items, total_bytes)``; totals are ``None``
#: for iterable sources, and while a path source is scanned (then it counts files found).
ProgressCallback = Callable[[int, int, "int | None", "int | None"], None]


def write_chunks(
    table: FileTable,
    chunks: list[np.ndarray],
    dest: Store,
    options: BuildOptions,
    executor: cf.Executor | None,
    progress: ProgressCallback | None,
    first: int = 0,
) -> dict[int, ChunkResult]:
    """Write every planned chunk not already done (by a killed run) into DEST's build state.

    ``first`` numbers the shards the chunks become (an append's follow the dataset's shards).
    """
    state_store = dest.child(state.STATE_FOLDER)
    shown = dest.shown()
    logger.info("%s: %d files planned into %d chunks", shown, len(table), len(chunks))
    done = state.load_chunk_records(state_store, len(chunks))
    done = state.drop_incomplete(dest, state_store, done, len(chunks), first)
    if done:
        logger.info("%s: resuming; %d of %d chunks already written", shown, len(done), len(chunks))
    tasks = (
        ChunkTask(index, state_store, options, table=table.take(indices))
        for index, indices in enumerate(chunks)
        if index not in done
    )
    tracker = Tracker(progress, len(table), table.num_bytes)
    for result in done.values():
        tracker.add(result)
    results = dict(done)
    run_tasks(
        write_chunk, tasks, lambda r: results.__setitem__(r.index, tracker.add(r)),
        options.workers, executor,
    )  # fmt: skip
    return results


class Tracker:
    """Counts finished chunks' items and bytes and reports them to a progress callback."""

    def __init__(
        self, callback: ProgressCallback | None, total: int | None, total_bytes: int | None
    ):
        self._callback, self._total, self._total_bytes = callback, total, total_bytes
        self.items = self.bytes = 0

    def add(self, result: ChunkResult) -> ChunkResult:
        self.items += result.num_items
        self.bytes += result.num_source_bytes
        if self._callback is not None:
            self._callback(self.items, self.bytes, self._total, self._total_bytes)
        return result
