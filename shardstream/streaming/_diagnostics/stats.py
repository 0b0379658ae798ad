"""Loader statistics: is it the data, and which part? Off by default, cheap when on.

With ``StreamOptions(stats=True)`` every process that reads (each DataLoader worker, or the
training process with ``num_workers=0``) adds its stage times and counts to its own row of a
small shared-memory table made with the dataset (so persistent, forked and spawned workers all
report): seconds reading from storage (tar parsing included), decoding, transforming and
collating, and samples, batches, bytes and skipped samples. A worker publishes once per batch
(a few numpy additions; no locks, no syscalls: each row has one writer). The training process
adds what only it sees: the time the loop waited for the next batch (the *data stall*) and the
time it held each batch (the training step).

:class:`LoaderStats` reads both: ``StreamingDataLoader.stats()`` returns it as a plain dict, and
``StreamOptions(stats_interval_s=60)`` logs a line on ``shardstream.stats`` at that interval. A
plain ``DataLoader`` gets the same with ``stats = LoaderStats(dataset)`` and
``for batch in stats.watch(loader)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from shardstream.errors import ConfigError
from shardstream.streaming._worker.pipeline import FIELDS, STAGES

if TYPE_CHECKING:
    from shardstream.streaming._dataset import StreamingDataset

__all__ = ["LoaderStats", "bottleneck", "format_line"]

logger = logging.getLogger("shardstream.stats")


def bottleneck(stages: dict[str, float], stall_share: float | None) -> str:
    """``"consumer"`` when the loop rarely waits for data, else the slowest worker stage.

    Examples:
        >>> bottleneck({"storage": 1.0, "decode": 3.0, "transform": 0.5, "collate": 0.1}, 0.6)
        'decode'
        >>> bottleneck({"storage": 1.0, "decode": 3.0, "transform": 0.5, "collate": 0.1}, 0.02)
        'consumer'
    """
    if stall_share is not None and stall_share < 0.1:
        return "consumer"
    return max(stages, key=lambda stage: stages[stage])


class LoaderStats:
    """Statistics of one dataset's loader: the workers' table plus the training loop's waits.

    Examples:
        >>> stats = LoaderStats(dataset)  # doctest: +SKIP
        >>> for batch in stats.watch(loader):  # doctest: +SKIP
        ...     train_step(batch)
        >>> stats.snapshot()["stall_share"]  # doctest: +SKIP
        0.03
    """

    def __init__(self, dataset: StreamingDataset, interval_s: float | None = None) -> None:
        board = dataset.stats_board
        if board is None:
            raise ConfigError("statistics are off: make the dataset with StreamOptions(stats=True)")
        self.board, self.interval_s = board, interval_s
        self.wait_s = self.step_s = 0.0
        self.batches = self.samples = 0
        self._started: float | None = None
        self._last_log = time.perf_counter()
        self._since: tuple[float, np.ndarray, float, int, int] | None = None
        #: One summary per finished pass over the loader (an epoch, or its rest after a resume).
        self.passes: list[dict[str, Any]] = []

    def watch(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Yield ``batches``, timing how long each took to arrive and how long it was held."""
        clock = time.perf_counter
        if self._started is None:
            self._started = clock()
        begin = (clock(), self.board.read(), self.wait_s, self.step_s, self.batches, self.samples)
        iterator = iter(batches)
        held_since: float | None = None
        while True:
            start = clock()
            if held_since is not None:
                self.step_s += start - held_since
            try:
                batch = next(iterator)
            except StopIteration:
                self.passes.append(self._since_then(*begin))
                return
            arrived = clock()
            self.wait_s += arrived - start
            self.batches += 1
            self.samples += _batch_length(batch)
            if self.interval_s is not None and arrived - self._last_log >= self.interval_s:
                self._log(arrived)
            held_since = clock()
            yield batch

    def snapshot(self) -> dict[str, Any]:
        """Everything measured since the first batch, as plain values, with ``passes``: one
        summary per finished pass (see the README's *Finding the bottleneck* for each key)."""
        table = self.board.read()
        wall = 0.0 if self._started is None else time.perf_counter() - self._started
        summary = _summary(table, wall, self.wait_s, self.step_s, self.batches, self.samples)
        return {**summary, "passes": list(self.passes)}

    def _since_then(self, then: float, table: np.ndarray, wait: float, step: float,
                    batches: int, samples: int) -> dict[str, Any]:  # fmt: skip
        return _summary(self.board.read() - table, time.perf_counter() - then,
                        self.wait_s - wait, self.step_s - step, self.batches - batches,
                        self.samples - samples)  # fmt: skip

    def _log(self, now: float) -> None:
        table = self.board.read()
        if self._since is not None:
            then, before, wait, batches, samples = self._since
            summary = _summary(table - before, now - then, self.wait_s - wait, None,
                               self.batches - batches, self.samples - samples)  # fmt: skip
            logger.info("%s", format_line(summary))
        self._since = (now, table, self.wait_s, self.batches, self.samples)
        self._last_log = now


def _batch_length(batch: Any) -> int:
    """Samples in a batch: the length of its first field (1 for a single sample)."""
    first = batch
    if isinstance(batch, dict):
        first = next(iter(batch.values()), None)
    elif isinstance(batch, (tuple, list)) and batch:
        first = batch[0]
    try:
        return len(first) if first is not batch else 1
    except TypeError:
        return 1


def _summary(table: np.ndarray, wall: float, wait: float, step: float | None, batches: int,
             samples: int) -> dict[str, Any]:  # fmt: skip
    totals = {field: float(table[:, number].sum()) for number, field in enumerate(FIELDS)}
    stages = {stage: totals[column] for stage, column in STAGES.items()}
    stall = wait / wall if wall > 0 else None
    workers = [  # worker None: the training process itself (num_workers=0)
        {"worker": number - 1 if number else None, **dict(zip(FIELDS, row.tolist(), strict=True))}
        for number, row in enumerate(table)
        if row.any()
    ]
    return {
        "wall_s": wall,
        "batches": batches,
        "samples": samples,
        "samples_per_s": samples / wall if wall > 0 else 0.0,
        "wait_s": wait,
        "step_s": step,
        "stall_share": stall,
        "stages_s": stages,
        "bytes": int(totals["bytes"]),
        "skipped": int(totals["skipped"]),
        "retries": int(totals["retries"]),
        "read_samples": int(totals["samples"]),
        "workers": workers,
        "bottleneck": bottleneck(stages, stall),
    }


def format_line(summary: dict[str, Any]) -> str:
    """One log line of a summary."""
    stages = ", ".join(f"{stage} {seconds:.1f}s" for stage, seconds in summary["stages_s"].items())
    stall = summary["stall_share"]
    shown = "n/a" if stall is None else f"{100 * stall:.0f}%"
    return (
        f"{summary['samples_per_s']:.0f} samples/s, data stall {shown}, worker time: {stages}, "
        f"{summary['bytes'] / 1e6:.0f} MB read, {summary['retries']} storage retries, "
        f"{summary['skipped']} skipped; "
        f"bottleneck: {summary['bottleneck']}"
    )
