"""What every row of the shuffle-quality benchmark shares: one epoch of a loader, timed, with its
DataLoader workers' private memory sampled, and the bookkeeping of the data folders written for
each peer (a marker written last, so a folder is reused only when complete).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import shutil
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: Written last into every data folder; a folder whose marker matches is reused.
MARKER = "_written.json"
#: Distributed settings of a single-process, single-rank run (read by mosaic and litdata).
SINGLE_RANK_ENV = {
    "RANK": "0",
    "WORLD_SIZE": "1",
    "LOCAL_RANK": "0",
    "LOCAL_WORLD_SIZE": "1",
    "GLOBAL_RANK": "0",
    "NODE_RANK": "0",
    "NNODES": "1",
}
#: Module that each peer needs, by peer.
PEER_MODULES = {"webdataset": "webdataset", "mosaic": "streaming", "litdata": "litdata"}


@dataclass
class PeerRun:
    """One epoch of one peer's loader.

    Attributes:
        name: Row name, e.g. ``"webdataset (buffer 1,000)"``.
        batches: Written positions of each batch's samples, in loader order.
        seconds: Wall time of the epoch, from ``iter(loader)`` (worker start included) to the end.
        worker_uss_mb: Peak over the epoch of the summed USS of the loader's worker processes.
        requests: For a remote read, what the server answered: ``(shard GETs, their mean
            bytes, other requests)``.
    """

    name: str
    batches: list[np.ndarray]
    seconds: float
    worker_uss_mb: float
    requests: tuple[int, float, int] | None = None

    def positions(self) -> np.ndarray:
        """All written positions in the order the loader yielded them."""
        return np.concatenate(self.batches) if self.batches else np.zeros(0, np.int64)


class WorkerMemory:
    """Peak summed USS (MiB) of the processes this process starts after this object exists.

    Those are the DataLoader workers (and anything they start). USS counts only pages private
    to a process, so copy-on-write pages still shared with the parent are not counted.
    """

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self._before = {child.pid for child in self._process.children(recursive=True)}
        self._lock = threading.Lock()
        self.peak_mb = 0.0

    def sample(self) -> None:
        """Sum the USS of the new descendants now and keep the maximum."""
        import psutil

        total = 0
        for child in self._process.children(recursive=True):
            if child.pid not in self._before:
                # A worker may exit between listing and reading: it then counts as 0.
                with contextlib.suppress(psutil.Error):
                    total += child.memory_full_info().uss
        with self._lock:
            self.peak_mb = max(self.peak_mb, total / 2**20)


@contextlib.contextmanager
def measure_worker_memory(interval_s: float = 0.2) -> Iterator[WorkerMemory]:
    """Sample :class:`WorkerMemory` every ``interval_s`` in a background thread inside the block.

    Example:
        >>> with measure_worker_memory() as memory:
        ...     batches = list(loader)
        >>> memory.peak_mb
    """
    memory, stop = WorkerMemory(), threading.Event()

    def sample_until_stopped() -> None:
        while not stop.is_set():
            memory.sample()
            stop.wait(interval_s)

    thread = threading.Thread(target=sample_until_stopped, daemon=True)
    thread.start()
    try:
        yield memory
    finally:
        stop.set()
        thread.join()


def unavailable_reason(peer: str) -> str | None:
    """Why ``peer`` (``"webdataset"``, ``"mosaic"``, ``"litdata"``) cannot run, or None."""
    try:
        importlib.import_module(PEER_MODULES[peer])
    except Exception as error:  # a broken dependency raises more than ImportError
        return f"{PEER_MODULES[peer]} does not import: {type(error).__name__}: {error}"
    return None


@contextlib.contextmanager
def environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables inside the block, restoring the previous values afterwards."""
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def iterate(name: str, loader: Iterable[Any], positions_of: Callable[[Any], Any]) -> PeerRun:
    """Run one epoch of ``loader``, timing it and measuring its workers' memory."""
    batches = []
    with measure_worker_memory() as memory:
        start = time.perf_counter()
        for batch in loader:
            batches.append(np.asarray(positions_of(batch), dtype=np.int64))
            if len(batches) == 1:
                memory.sample()  # workers are surely alive now, even in an epoch under 0.2 s
        seconds = time.perf_counter() - start
    return PeerRun(name, batches, seconds, memory.peak_mb)


def is_written(folder: Path, num_samples: int, per_shard: int) -> bool:
    marker = folder / MARKER
    if not marker.exists():
        return False
    return json.loads(marker.read_text()) == {"num_samples": num_samples, "per_shard": per_shard}


def start_writing(folder: Path) -> None:
    """Remove a partly written or stale folder; writers need it absent or empty."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.parent.mkdir(parents=True, exist_ok=True)


def finish_writing(folder: Path, num_samples: int, per_shard: int) -> None:
    marker = {"num_samples": num_samples, "per_shard": per_shard}
    (folder / MARKER).write_text(json.dumps(marker))


def read_index(folder: Path) -> dict[str, Any]:
    return json.loads((folder / "index.json").read_text())


def check_shard_sizes(folder: Path, sizes: list[int], per_shard: int) -> None:
    """Every shard but the last holds ``per_shard`` samples, the last at most that."""
    if any(size != per_shard for size in sizes[:-1]) or sizes[-1] > per_shard:
        raise RuntimeError(
            f"shards in {folder} hold {sorted(set(sizes))} samples, expected {per_shard}"
        )
