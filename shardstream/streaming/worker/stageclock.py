"""Per-process stage counters for loader statistics, in one shared-memory table.

Each reading process (a DataLoader worker, or the training process without workers) owns one
row and is its only writer; it adds what a :class:`StageClock` counted once per batch. See
:mod:`shardstream.streaming.diagnostics.stats` for what the training process makes of them.
"""

from __future__ import annotations

import numpy as np

__all__ = ["FIELDS", "STAGES", "StageClock", "StatsBoard"]

#: What each reading process counts, one column each.
FIELDS = ("read_s", "decode_s", "transform_s", "collate_s", "samples", "batches", "bytes",
          "skipped", "retries")  # fmt: skip
#: The stages a batch goes through in a worker, with the column of each.
STAGES = {"storage": "read_s", "decode": "decode_s", "transform": "transform_s",
          "collate": "collate_s"}  # fmt: skip


class StatsBoard:
    """One shared-memory row of counters per reading process: row 0 is the training process
    (``num_workers=0``), row ``w + 1`` DataLoader worker ``w``.

    Args:
        max_workers: The most DataLoader workers that will report (the dataset passes the
            most its channel supports).
    """

    def __init__(self, max_workers: int) -> None:
        import torch

        self._table = torch.zeros((max_workers + 1, len(FIELDS)), dtype=torch.float64)
        self._table.share_memory_()

    def row(self, worker: int | None) -> np.ndarray:
        """The row a process adds to (a numpy view of the shared table)."""
        return self._table.numpy()[0 if worker is None else worker + 1]

    def read(self) -> np.ndarray:
        """A copy of the whole table."""
        return self._table.numpy().copy()


class StageClock:
    """What one process counted since it last published: plain float attributes (one
    attribute add per sample, no array access), added to the shared row once per batch."""

    __slots__ = ("row", *FIELDS)
    read_s: float
    decode_s: float
    transform_s: float
    collate_s: float
    samples: float
    batches: float
    bytes: float
    skipped: float
    retries: float

    def __init__(self, row: np.ndarray) -> None:
        self.row = row
        self._zero()

    def _zero(self) -> None:
        self.read_s = self.decode_s = self.transform_s = self.collate_s = 0.0
        self.samples = self.batches = self.bytes = self.skipped = self.retries = 0.0

    def publish(self) -> None:
        """Add what was counted to the shared row (once per batch)."""
        self.row += [getattr(self, field) for field in FIELDS]
        self._zero()
