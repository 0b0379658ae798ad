"""One call after restoring a checkpoint: is the loader where the trainer is?

A resume can fail silently: a wrapper that drops the loader's state starts it at batch 0 while
the trainer is at step 5,000, or a state comes from another checkpoint than the model's. The
job then trains on the wrong data and exits 0. :func:`check_position` compares the loader's
position (:class:`~shardstream.streaming._control.position.Position`) with the trainer's step and
raises with both. It reads a few integers: it costs nothing, whatever the dataset's size.

A resume audit for training loops: which keys each step consumed, per rank, and after
restarts how many samples came twice and how many never came.

One line in a loop, ``audit.record(step, batch)``, appends a 128-bit digest of every key the
step consumed to this rank's file for this run (one write; memory and time per step follow the
batch, never the run's length). :meth:`ResumeAudit.report` reads every rank's runs, keeps of
each run only the steps no later run redid (a restart goes back to its checkpoint's step, and
the steps after it are trained again), and counts per epoch: samples consumed, distinct ones,
duplicates (consumed beyond the first time) and skips (expected but never consumed). It holds
at most ``memory_bytes`` of digests at once, reading the files in as many passes as that takes."""

from __future__ import annotations

import dataclasses
import hashlib
import pathlib
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from shardstream.errors import ConfigError
from shardstream.streaming._control.context import current_context
from shardstream.streaming._control.position import Position, check_resumed
from shardstream.streaming._control.resumestate import decode_pass
from shardstream.streaming._dataset import StreamingDataset
from shardstream.streaming._loader import StreamingDataLoader

__all__ = [
    "AuditReport",
    "EpochAudit",
    "Position",
    "ResumeAudit",
    "check_position",
    "loader_position",
]


def check_position(loader: Any, step: int, grad_accumulation: int = 1) -> Position:
    """Raise unless ``loader`` consumed ``step * grad_accumulation`` batches on this rank.

    Call it after restoring a checkpoint (model, optimizer and the loader's state), before the
    loop goes on; a fresh run passes with step 0.

    Args:
        loader: A :class:`~shardstream.StreamingDataLoader`, or torchdata's
            ``StatefulDataLoader`` over a :class:`~shardstream.StreamingDataset`.
        step: The trainer's optimizer steps, restored from the same checkpoint (a loop that
            counts batches passes its batch count and ``grad_accumulation=1``).
        grad_accumulation: Batches per optimizer step.

    Returns:
        The loader's position.

    Raises:
        ResumeError: The loader is elsewhere; the message names both positions.

    Examples:
        >>> loader.load_state_dict(checkpoint["loader"])  # doctest: +SKIP
        >>> check_position(loader, checkpoint["step"], grad_accumulation=4)  # doctest: +SKIP
    """
    if step < 0 or grad_accumulation < 1:
        raise ConfigError(
            f"check_position needs step >= 0 and grad_accumulation >= 1, got {step} and "
            f"{grad_accumulation}"
        )
    position = loader_position(loader)
    batches = step * grad_accumulation
    per_step = f" x {grad_accumulation} batches per step" if grad_accumulation > 1 else ""
    check_resumed(position, f"step {step}{per_step} ({batches} batches)", global_batches=batches)
    return position


def loader_position(loader: Any) -> Position:
    """The position of a ``StreamingDataLoader`` or of a ``StatefulDataLoader`` over a
    ``StreamingDataset`` (restored or not; nothing is iterated).

    Raises:
        ConfigError: Another kind of loader or dataset.
    """
    if isinstance(loader, StreamingDataLoader):
        return loader.position()
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, StreamingDataset) or not hasattr(loader, "next_iter_state"):
        raise ConfigError(
            f"check_position takes a StreamingDataLoader, or torchdata's StatefulDataLoader over "
            f"a StreamingDataset; got {type(loader).__name__} over {type(dataset).__name__}"
        )
    iterator = getattr(loader, "_iterator", None)  # torchdata keeps the live one there
    state = loader.next_iter_state if iterator is None else iterator.state_dict()
    return _stateful_position(dataset, state)


def _stateful_position(dataset: StreamingDataset, state: Mapping[str, Any] | None) -> Position:
    """A StatefulDataLoader's position from its state (restored, or of the live iterator): its
    batch count in the epoch, and the epoch its workers' dataset states read."""
    length = len(dataset) if dataset.counted else None
    if not state:  # not restored: where a fresh loader starts
        return Position(dataset.epoch, 0, dataset.epoch * (length or 0), length)
    snapshot = state.get("_snapshot")
    if snapshot is None:  # no workers: the loader's own counters and the dataset's state
        batches, dataset_states = int(state["_num_yielded"]), [state.get("dataset_state")]
    else:
        batches = int(snapshot["_snapshot_step"]) + int(state["_steps_since_snapshot"])
        workers = snapshot["_worker_snapshots"].values()
        dataset_states = [worker.get("dataset_state") for worker in workers]
    epochs = [decode_pass(item).epoch for item in dataset_states if item]
    epoch = max(epochs) if epochs else dataset.epoch
    # A StatefulDataLoader resumes at the same layout only, so every epoch had this length.
    total = epoch * (length or 0) + batches
    if state.get("_iterator_finished") or (length is not None and batches >= length):
        return Position(epoch + 1, 0, total, length)  # the next batch is the next epoch's
    return Position(epoch, batches, total, length)


#: One consumed sample: its epoch, the trainer's step, and the 128-bit digest of its key.
RECORD = np.dtype([("epoch", "<i8"), ("step", "<i8"), ("key", "<u8", (2,))])
_MEMORY_BYTES = 256 << 20


@dataclasses.dataclass(frozen=True)
class EpochAudit:
    """One epoch's counts over all ranks, after restarts.

    Attributes:
        epoch: The epoch.
        consumed: Samples consumed (each duplicate counted).
        distinct: Distinct keys consumed.
        duplicates: ``consumed - distinct``: samples that came more than once.
        skips: Samples expected but never consumed (None without ``expected``).
    """

    epoch: int
    consumed: int
    distinct: int
    duplicates: int
    skips: int | None


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """What :meth:`ResumeAudit.report` found: per epoch counts, and where runs restarted.

    Attributes:
        epochs: Counts per epoch, in order.
        restarts: ``(epoch, step)`` at which later runs started (their first record).
    """

    epochs: list[EpochAudit]
    restarts: list[tuple[int, int]]

    def __str__(self) -> str:
        restarts = ", ".join(f"epoch {e} step {s}" for e, s in self.restarts) or "none"
        lines = [f"restarts: {restarts}"]
        for item in self.epochs:
            skips = "?" if item.skips is None else item.skips
            lines.append(
                f"epoch {item.epoch}: {item.consumed} consumed, {item.distinct} distinct, "
                f"{item.duplicates} duplicates, {skips} skips"
            )
        return "\n".join(lines)


class ResumeAudit:
    """Record the keys each training step consumed on this rank; report duplicates and skips.

    Args:
        directory: A folder shared by the ranks (one file per rank and run).
        rank: This rank (default: ``torch.distributed``'s, else 0).

    Examples:
        >>> audit = ResumeAudit("checkpoints/audit")  # doctest: +SKIP
        >>> for batch in loader:  # doctest: +SKIP
        ...     audit.record(step, batch, epoch)  # dict batches: their __key__ (and __valid__)
        >>> report = ResumeAudit.report("checkpoints/audit", expected=ds.manifest.num_samples)
    """

    def __init__(self, directory: str | pathlib.Path, rank: int | None = None) -> None:
        self.directory = pathlib.Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.rank = current_context().rank if rank is None else int(rank)
        name = f"run-{time.time_ns():020d}-rank{self.rank:05d}.keys"
        #: This run's file (made at its first record: a run that records nothing leaves none).
        self.path = self.directory / name

    def record(self, step: int, batch: Any, epoch: int = 0) -> None:
        """Record the keys of one step's batch (``__valid__`` False entries left out).

        Args:
            step: The trainer's step (or batch count), restored with its checkpoint: several
                records may share one (gradient accumulation).
            batch: A dict batch or sample with ``__key__`` (``StreamOptions(output="dict")``),
                or the keys themselves.
            epoch: The epoch the batch belongs to.

        Raises:
            ConfigError: The batch carries no keys.
        """
        digests = key_digests(keys_of(batch))
        records = np.empty(len(digests), dtype=RECORD)
        records["epoch"], records["step"], records["key"] = epoch, step, digests
        # Opened per step, unbuffered: a run killed at any point has written every step it
        # recorded, and nothing is left open for the run to close.
        with open(self.path, "ab", buffering=0) as file:
            file.write(records.tobytes())

    @staticmethod
    def report(
        directory: str | pathlib.Path,
        expected: int | None = None,
        memory_bytes: int = _MEMORY_BYTES,
    ) -> AuditReport:
        """Count per epoch over every rank's runs in ``directory``, after restarts.

        Args:
            directory: The audit's folder.
            expected: Samples an epoch should hold, each once (the dataset's count); without
                it, skips are not counted. An epoch still under way counts what it has not
                read yet as skips.
            memory_bytes: Most digests held at once (the files are read in as many passes).
        """
        runs = _effective_runs(pathlib.Path(directory))
        total = sum(int(run.keep_mask().sum()) for run in runs)
        passes = max(1, -(-total * RECORD.itemsize * 2 // memory_bytes))
        consumed: dict[int, int] = {}
        distinct: dict[int, int] = {}
        for bucket in range(passes):
            rows = _bucket_rows(runs, bucket, passes)
            epochs, counts = np.unique(rows[:, 0].astype(np.int64), return_counts=True)
            for epoch, count in zip(epochs.tolist(), counts.tolist(), strict=True):
                consumed[epoch] = consumed.get(epoch, 0) + count
            unique = np.unique(rows, axis=0) if len(rows) else rows
            epochs, counts = np.unique(unique[:, 0].astype(np.int64), return_counts=True)
            for epoch, count in zip(epochs.tolist(), counts.tolist(), strict=True):
                distinct[epoch] = distinct.get(epoch, 0) + count
        audits = [_epoch_audit(epoch, consumed[epoch], distinct[epoch], expected)
                  for epoch in sorted(consumed)]  # fmt: skip
        origin = {min(runs, key=lambda run: run.created).start} if runs else set()
        return AuditReport(audits, sorted({run.start for run in runs} - origin))


def _epoch_audit(epoch: int, consumed: int, distinct: int, expected: int | None) -> EpochAudit:
    skips = None if expected is None else expected - distinct
    return EpochAudit(epoch, consumed, distinct, consumed - distinct, skips)


def keys_of(batch: Any) -> list[str]:
    """The keys a batch (or sample) counts: ``__key__`` without ``__valid__`` False entries."""
    if isinstance(batch, str):
        return [batch]
    if isinstance(batch, dict):
        if "__key__" not in batch:
            raise ConfigError(
                "ResumeAudit.record needs each batch's keys: make the dataset with "
                "StreamOptions(output='dict') (batches then carry '__key__'), or pass the keys"
            )
        keys = batch["__key__"]
        keys = [keys] if isinstance(keys, str) else list(keys)
        valid = batch.get("__valid__")
        if valid is None:
            return keys
        marks = valid.tolist() if hasattr(valid, "tolist") else valid
        marks = [marks] if isinstance(marks, bool) else marks
        return [key for key, mark in zip(keys, marks, strict=True) if mark]
    if isinstance(batch, Iterable):
        return [str(key) for key in batch]
    raise ConfigError(f"ResumeAudit.record takes a dict batch or keys, got {type(batch).__name__}")


def key_digests(keys: list[str]) -> np.ndarray:
    """128-bit digests of ``keys`` (two uint64 each): distinct keys collide with probability
    about ``n**2 / 2**129``, so counts are exact in practice."""
    joined = b"".join(hashlib.blake2b(key.encode(), digest_size=16).digest() for key in keys)
    return np.frombuffer(joined, dtype="<u8").reshape(-1, 2)


@dataclasses.dataclass
class _Run:
    """One rank's records of one run, and from where later runs redid its steps."""

    created: int
    rank: int
    records: np.ndarray
    cut: tuple[int, int] | None = None  # records at or after this (epoch, step) were redone

    @property
    def start(self) -> tuple[int, int]:
        return int(self.records["epoch"][0]), int(self.records["step"][0])

    def keep_mask(self) -> np.ndarray:
        if self.cut is None:
            return np.ones(len(self.records), dtype=bool)
        epoch, step = self.records["epoch"], self.records["step"]
        return (epoch < self.cut[0]) | ((epoch == self.cut[0]) & (step < self.cut[1]))


def _effective_runs(directory: pathlib.Path) -> list[_Run]:
    """Every run's records, each cut where a later run started over.

    A later run redoes an earlier one's steps from its own start: the same rank's earlier runs
    always (a restart of that rank), another rank's when they started elsewhere (another
    launch: the ranks of one launch start at the same step).
    """
    runs = []
    for path in sorted(directory.glob("run-*-rank*.keys")):
        created, rank = path.stem.split("-")[1:]
        if path.stat().st_size >= RECORD.itemsize:
            records = np.memmap(path, dtype=RECORD, mode="r")
            runs.append(_Run(int(created), int(rank.removeprefix("rank")), records))
    for run in runs:
        later = [
            other.start
            for other in runs
            if other.created > run.created and (other.rank == run.rank or other.start != run.start)
        ]
        run.cut = min(later) if later else None
    return runs


def _bucket_rows(runs: list[_Run], bucket: int, buckets: int) -> np.ndarray:
    """``(epoch, digest high, digest low)`` rows of the kept records in one digest bucket."""
    collected = [
        _rows(run.records[run.keep_mask() & (run.records["key"][:, 0] % buckets == bucket)])
        for run in runs
    ]
    return np.concatenate(collected) if collected else np.empty((0, 3), dtype=np.uint64)


def _rows(records: np.ndarray) -> np.ndarray:
    rows = np.empty((len(records), 3), dtype=np.uint64)
    rows[:, 0] = records["epoch"].astype(np.uint64)
    rows[:, 1:] = records["key"]
    return rows
