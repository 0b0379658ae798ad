"""Where this process sits: rank, world size, DataLoader worker. The only reader of that state.

:func:`current_context` is the one function in shardstream that reads ``torch.distributed`` and
``get_worker_info()``; everything else takes a :class:`Context` (or its numbers) as arguments, so
it can be tested without processes. :func:`post_first` is the one use of the process group
(its key-value store: ranks agree on the version of a growing dataset they read without waiting
for each other); shardstream runs no collective.

What the training process tells its DataLoader workers about epochs, through shared memory.

A DataLoader worker holds a copy of the dataset made when the worker started; with
``persistent_workers=True`` that copy lives for the whole run, so an attribute set later in the
training process never reaches it. :class:`EpochChannel` keeps the few values that must reach
every worker in two small shared-memory tensors created with the dataset, which forked and
spawned workers alike share:

- the epoch pinned by ``set_epoch`` (and a counter of such calls);
- per worker slot, how many passes that worker has started since the pin, so each new pass
  moves to the next epoch by itself (Lightning and plain loops never call ``set_epoch`` on an
  IterableDataset), identically in every worker and rank;
- a *directive* for the next pass (epoch, earlier passes of the epoch, batches already
  consumed), posted by :class:`~shardstream.streaming._loader.StreamingDataLoader` before each
  pass and taken once by every worker;
- the version of a growing dataset fresh epochs read, which the training process settles
  with the other ranks (:mod:`~shardstream.streaming._control.versionset`) and may move on.

Slots are per (number of workers, worker), so passes with another worker count, or a
``list(dataset)`` in the training process, count separately."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
from collections.abc import Iterator

from shardstream.errors import ConfigError
from shardstream.streaming._control.resumestate import (
    PassState,
    VersionNumber,
    decode_pass,
    encode_pass,
)

__all__ = [
    "Context",
    "EpochChannel",
    "MAX_WORKERS",
    "current_context",
    "post_first",
    "worker_thread",
]


#: The worker a thread of a thread loader plays: ``(worker, num_workers)``, per thread.
_thread_worker = threading.local()


@dataclasses.dataclass(frozen=True)
class Context:
    """Rank and worker of the calling process.

    Attributes:
        rank: Rank among ``world_size`` training processes.
        world_size: Number of training processes.
        worker: DataLoader worker id, 0 in the main process.
        num_workers: DataLoader workers per rank (or threads of a thread loader), 1 when
            loading in the main process.
        in_worker: Inside a DataLoader worker process (batches then go to shared memory).
        in_thread: On a thread of a thread loader (``StreamingDataLoader(num_threads=N)``):
            the worker ``worker`` of ``num_workers``, in the training process.
    """

    rank: int = 0
    world_size: int = 1
    worker: int = 0
    num_workers: int = 1
    in_worker: bool = False
    in_thread: bool = False


@contextlib.contextmanager
def worker_thread(worker: int, num_workers: int) -> Iterator[None]:
    """Make the calling thread play DataLoader worker ``worker`` of ``num_workers``.

    A thread loader runs each worker's pass on a thread of the training process; inside this
    block :func:`current_context` gives that thread the worker's place, as
    ``get_worker_info()`` gives a worker process its own, so the same plan is read.

    Example:
        >>> with worker_thread(1, 2):
        ...     current_context().worker
        1
    """
    if not 0 <= worker < num_workers:
        raise ConfigError(f"worker must be in [0, num_workers={num_workers}), got {worker}")
    _thread_worker.place = (worker, num_workers)
    try:
        yield
    finally:
        del _thread_worker.place


def current_context(rank: int | None = None, world_size: int | None = None) -> Context:
    """Read rank/world size (arguments, else ``torch.distributed``) and the DataLoader worker.

    Args:
        rank: Explicit rank; overrides ``torch.distributed``. Give both or neither.
        world_size: Explicit world size.

    Raises:
        ConfigError: Only one of ``rank``/``world_size`` was given, or they are inconsistent.

    Examples:
        >>> current_context(rank=1, world_size=4).rank
        1
    """
    import torch.distributed as dist
    import torch.utils.data

    if (rank is None) != (world_size is None):
        raise ConfigError("pass both rank and world_size, or neither (to use torch.distributed)")
    if rank is None or world_size is None:
        if dist.is_available() and dist.is_initialized():
            rank, world_size = dist.get_rank(), dist.get_world_size()
        else:
            rank, world_size = 0, 1
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank}")
    place = getattr(_thread_worker, "place", None)
    if place is not None:
        return Context(rank, world_size, place[0], place[1], in_thread=True)
    info = torch.utils.data.get_worker_info()
    if info is None:
        return Context(rank, world_size)
    return Context(rank, world_size, info.id, info.num_workers, in_worker=True)


def post_first(key: str, value: str) -> str | None:
    """The value the job's first process to post under ``key`` posted (``value`` if this one).

    Under torch.distributed this is one atomic compare-and-set on the process group's store
    (the ``TCPStore`` or ``FileStore`` the group was made with): no rank waits for another, so
    any subset of the ranks may call it, at any time. Without torch.distributed, or with one
    rank, it returns None without talking to anyone.

    Args:
        key: A key that names what is agreed on (the same on every rank).
        value: What this process proposes.

    Examples:
        >>> post_first("shardstream/example", "3") is None  # without torch.distributed
        True
    """
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return None
    held = c10d._get_default_store().compare_set(key, "", value)
    return bytes(held).decode()


#: Largest DataLoader ``num_workers`` supported (slots for every worker count up to it).
MAX_WORKERS = 128
_PINNED, _PIN_COUNT, _GENERATION, _LENGTH, _AHEAD, _FIRST_SLOT = 0, 1, 2, 3, 4, 5
_SLOT_INTS = 3  # passes started since the pin, directive generation taken, restore report
_NUM_SLOTS = MAX_WORKERS * (MAX_WORKERS + 1) // 2
_DIRECTIVE_BYTES = 1 << 16


def _slot(worker: int, num_workers: int) -> int:
    if not 1 <= num_workers <= MAX_WORKERS:
        raise ConfigError(f"num_workers must be at most {MAX_WORKERS}, got {num_workers}")
    return _FIRST_SLOT + _SLOT_INTS * ((num_workers - 1) * num_workers // 2 + worker)


class EpochChannel:
    """Shared epoch state of one dataset object and all its DataLoader workers.

    Examples:
        >>> channel = EpochChannel()
        >>> channel.take(worker=0, num_workers=1)
        (0, None)
        >>> channel.take(worker=0, num_workers=1)  # the next pass moves on by itself
        (1, None)
        >>> channel.pin(5); channel.take(0, 1)
        (5, None)
    """

    def __init__(self, version: VersionNumber = None) -> None:
        import torch

        self._ints = torch.zeros(_FIRST_SLOT + _SLOT_INTS * _NUM_SLOTS, dtype=torch.int64)
        self._ints.share_memory_()
        self._text = torch.zeros(_DIRECTIVE_BYTES, dtype=torch.uint8).share_memory_()
        # [kind, numbers...]: kind 0 no version, 1 a dataset's, 2 a mixture's (one per stream)
        size = 1 + (len(version) if isinstance(version, tuple) else 1)
        self._version = torch.zeros(size, dtype=torch.int64).share_memory_()
        self.set_version(version)

    @property
    def version(self) -> VersionNumber:
        """The version fresh epochs read (None: the dataset has no versions)."""
        kind, numbers = int(self._version[0]), [int(n) for n in self._version[1:]]
        return None if kind == 0 else numbers[0] if kind == 1 else tuple(numbers)

    def set_version(self, version: VersionNumber) -> None:
        """Make every process's next fresh epoch read ``version``."""
        if isinstance(version, tuple):
            for position, number in enumerate(version, start=1):
                self._version[position] = number
            self._version[0] = 2
        else:
            self._version[1] = version or 0
            self._version[0] = 0 if version is None else 1

    @property
    def pinned(self) -> int:
        """The epoch given to the last ``pin`` (0 before any)."""
        return int(self._ints[_PINNED])

    @property
    def pin_count(self) -> int:
        """How many times ``pin`` was called: tells a loader that ``set_epoch`` happened."""
        return int(self._ints[_PIN_COUNT])

    def pin(self, epoch: int) -> None:
        """The next pass of every worker reads ``epoch``; later passes count on from it."""
        self._ints[_PINNED] = epoch
        self._ints[_PIN_COUNT] += 1
        self._ints[_FIRST_SLOT::_SLOT_INTS] = 0

    @property
    def ahead(self) -> bool:
        """Whether a process that finished a pass will read the next one (persistent workers,
        or the training process itself): it may then announce the next pass's first pieces."""
        return bool(self._ints[_AHEAD])

    def set_ahead(self, ahead: bool) -> None:
        """Say whether the processes that read passes outlive them (see :attr:`ahead`)."""
        self._ints[_AHEAD] = int(ahead)

    def post(self, directive: PassState) -> None:
        """Make every worker's next pass read ``directive`` (the rest of an epoch, or one)."""
        data = json.dumps(encode_pass(directive), sort_keys=True).encode("utf-8")
        if len(data) > _DIRECTIVE_BYTES:
            raise ConfigError(f"resume state too large for workers ({len(data)} bytes)")
        import torch

        self._text[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
        self._ints[_LENGTH] = len(data)
        self._ints[_GENERATION] += 1

    def take(self, worker: int, num_workers: int) -> tuple[int, PassState | None]:
        """Start a pass in this worker: ``(epoch, directive or None)``."""
        slot = _slot(worker, num_workers)
        generation = int(self._ints[_GENERATION])
        if generation > int(self._ints[slot + 1]):
            self._ints[slot + 1] = generation
            length = int(self._ints[_LENGTH])
            text = self._text[:length].numpy().tobytes().decode("utf-8")
            directive = decode_pass(json.loads(text))
            self.restored(worker, num_workers, directive.epoch)
            return directive.epoch, directive
        epoch = self.pinned + int(self._ints[slot])
        self._ints[slot] += 1
        return epoch, None

    def restored(self, worker: int, num_workers: int, epoch: int) -> None:
        """This worker is (re)reading ``epoch``: its next fresh pass reads ``epoch + 1``."""
        self._ints[_slot(worker, num_workers)] = epoch + 1 - self.pinned

    def report(self, worker: int, num_workers: int, token: int, done: bool) -> None:
        """Tell the other workers whether this one has finished the restored pass ``token``."""
        self._ints[_slot(worker, num_workers) + 2] = 2 * token + int(done)

    def wait_reports(self, num_workers: int, token: int, timeout_s: float) -> list[bool] | None:
        """Every worker's report for pass ``token`` (they restore at the same moment), or None.

        Used once after a restore, to learn whether the whole rank had finished the epoch.
        """
        slots = [_slot(worker, num_workers) + 2 for worker in range(num_workers)]
        deadline = time.monotonic() + timeout_s
        while True:
            values = [int(self._ints[slot]) for slot in slots]
            if all(value // 2 == token for value in values):
                return [bool(value % 2) for value in values]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.001)
