"""Byte ranges announced before they are opened: fetched in the background within a budget.

A streaming worker knows which pieces of which shards it will open next (its window's plan),
but opens each only when its first sample is due, and every open on an object store waits for
a first byte. :class:`PrefetchQueue` takes those
announcements (:meth:`PrefetchQueue.hint`), opens the ranges ahead of use as background
streams (their spans fetched by the shared :class:`~shardstream.storage.remote.prefetch.FetchPool`),
and hands a stream over when the same range is opened (:meth:`PrefetchQueue.take`).

Memory bound: the streams opened ahead and not yet taken cover at most ``budget_bytes`` per
process (``ReadOptions.prefetch_bytes``); the rest of the announced ranges wait as plain
``(key, size)`` entries and start as taken ones free the budget. Each group of hints (one per
reader of a stream of pieces) replaces that group's previous hints, and :meth:`forget` closes
what a group no longer needs, so nothing announced and never opened lingers.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import IO, Any

from shardstream.storage.processlocal import ProcessLocal

__all__ = ["PrefetchQueue", "forget", "process_queue", "range_key", "take"]

Opener = Callable[[], IO[bytes]]


class PrefetchQueue:
    """Ranges opened ahead of use, in announced order, within ``budget_bytes``.

    Args:
        budget_bytes: Bytes of ranges opened ahead and not yet taken, at most (one range is
            always allowed, however large).
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._pending: collections.OrderedDict[Hashable, tuple[Hashable, int, Opener]] = (
            collections.OrderedDict()
        )
        self._ready: dict[Hashable, tuple[Hashable, int, IO[bytes]]] = {}
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        """Bytes of ranges opened ahead and not yet taken."""
        return self._used

    def hint(self, group: Hashable, ranges: Sequence[tuple[Hashable, int, Opener]]) -> None:
        """Announce ``(key, num_bytes, opener)`` ranges, soonest first, replacing ``group``'s.

        Ranges of the group that are open already and announced again are kept; the others
        of the group are closed. A range another group announced (and has not opened) moves to
        ``group``: the streams of a next pass announced while the last one ended are taken
        over by the next pass's readers, and what they do not announce goes with the old group.
        """
        wanted = {key for key, _, _ in ranges}
        self.forget(group, keep=wanted)
        with self._lock:
            for key, size, opener in ranges:
                if key in self._ready:
                    _, held, stream = self._ready[key]
                    self._ready[key] = (group, held, stream)
                elif key in self._pending:
                    self._pending[key] = (group, *self._pending[key][1:])
                else:
                    self._pending[key] = (group, size, opener)
        self._start()

    def take(self, key: Hashable) -> IO[bytes] | None:
        """The stream opened ahead for ``key`` (the caller owns it now), or None."""
        with self._lock:
            self._pending.pop(key, None)  # opened now by the caller, not ahead
            entry = self._ready.pop(key, None)
            if entry is not None:
                self._used -= entry[1]
        if entry is None:
            return None
        self._start()
        return entry[2]

    def forget(self, group: Hashable, keep: set[Hashable] | None = None) -> None:
        """Drop ``group``'s announced ranges (but those in ``keep``); close their streams."""
        closing = []
        with self._lock:
            for key in [k for k, v in self._pending.items() if v[0] == group]:
                if keep is None or key not in keep:
                    del self._pending[key]
            for key in [k for k, v in self._ready.items() if v[0] == group]:
                if keep is None or key not in keep:
                    _, size, stream = self._ready.pop(key)
                    self._used -= size
                    closing.append(stream)
        for stream in closing:
            stream.close()
        if closing:
            self._start()

    def _start(self) -> None:
        """Open announced ranges, soonest first, while the budget allows."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                key, (group, size, opener) = next(iter(self._pending.items()))
                if self._ready and self._used + size > self.budget_bytes:
                    return
                del self._pending[key]
                self._used += size
            try:
                stream = opener()  # submits the range's spans to the pool; does not wait
            except Exception:  # the caller's own open will meet (and report) the problem
                with self._lock:
                    self._used -= size
                continue
            with self._lock:
                self._ready[key] = (group, size, stream)


_queue: ProcessLocal[PrefetchQueue] = ProcessLocal(lambda: PrefetchQueue(0))


def process_queue(budget_bytes: int) -> PrefetchQueue:
    """This process's queue (a forked child gets its own), its budget raised to at least this."""
    queue = _queue.get()
    queue.budget_bytes = max(queue.budget_bytes, budget_bytes)
    return queue


def range_key(fs: Any, path: str, start: int, end: int) -> Hashable:
    """What identifies an announced range: the filesystem instance, path and bytes."""
    return (id(fs), path, start, end)


def take(key: Hashable) -> IO[bytes] | None:
    """This process's stream opened ahead for ``key`` (see :meth:`PrefetchQueue.take`)."""
    queue = _queue.peek()
    return None if queue is None else queue.take(key)


def forget(group: Hashable) -> None:
    """Drop this process's announcements of ``group`` (see :meth:`PrefetchQueue.forget`)."""
    queue = _queue.peek()
    if queue is not None:
        queue.forget(group)
