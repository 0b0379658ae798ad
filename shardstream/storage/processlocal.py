"""One object per process: what a forked child inherits from its parent is never used.

Thread pools, prefetch queues and buffer pools belong to the process that made them: after a
fork (DataLoader workers) the parent's threads do not exist in the child and its streams are
the parent's. :class:`ProcessLocal` hands each process its own. Locks that background threads
hold are :class:`ProcessLock` s, unlocked in a forked child: a thread of the parent that held
one at the fork (a fetch thread, while a DataLoader forks its workers) does not exist there,
and would hold it forever.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ProcessLocal", "ProcessLock"]

T = TypeVar("T")


#: Every ProcessLock and ProcessLocal (each guards itself with ``_lock``), to be unlocked in a
#: forked child.
_ALL: weakref.WeakSet[Any] = weakref.WeakSet()


def _unlock_in_child() -> None:
    for lock in list(_ALL):
        lock._lock = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_unlock_in_child)


class ProcessLock:
    """A lock between the threads of one process, found unlocked by a forked child.

    A thread that holds a plain lock at a fork does not exist in the child, so the child's
    copy stays locked forever: its first ``with`` hangs. Guard anything a background thread
    may hold while a DataLoader forks its workers with this instead.

    Examples:
        >>> lock = ProcessLock()
        >>> with lock:
        ...     pass
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _ALL.add(self)

    def __enter__(self) -> ProcessLock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class ProcessLocal(Generic[T]):
    """This process's value, made on first use in each process.

    An attribute of an object that is pickled to another process (a spawned DataLoader worker)
    travels as ``make`` alone: the other process makes its own value.

    Examples:
        >>> counters = ProcessLocal(list)
        >>> counters.get().append(1); counters.get()
        [1]
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._pid: int | None = None
        self._value: T | None = None
        self._lock = threading.Lock()  # made anew in a forked child (see ProcessLock)
        _ALL.add(self)

    def get(self) -> T:
        """The value of the calling process (made now if this process has none yet)."""
        with self._lock:
            if self._pid != os.getpid() or self._value is None:
                self._value, self._pid = self._make(), os.getpid()
            return self._value

    def peek(self) -> T | None:
        """The calling process's value if it made one, else ``None`` (nothing is made)."""
        with self._lock:
            return self._value if self._pid == os.getpid() else None

    def __getstate__(self) -> dict[str, Any]:
        return {"make": self._make}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["make"])  # type: ignore[misc]
