"""One object per process: what a forked child inherits from its parent is never used.

Thread pools, prefetch queues and buffer pools belong to the process that made them: after a
fork (DataLoader workers) the parent's threads do not exist in the child and its streams are
the parent's. :class:`ProcessLocal` hands each process its own.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["ProcessLocal"]

T = TypeVar("T")


class ProcessLocal(Generic[T]):
    """This process's value, made on first use in each process.

    An attribute of an object that is pickled to another process (a spawned DataLoader worker)
    travels as ``make`` alone: the other process makes its own value.

    Example:
        >>> counters = ProcessLocal(list)
        >>> counters.get().append(1); counters.get()
        [1]
    """

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._pid: int | None = None
        self._value: T | None = None
        self._lock = threading.Lock()

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
