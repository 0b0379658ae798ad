"""An ordered background stage: one iterator run on a thread of its own, a few items ahead.

The one thread machinery of the training process: the thread loader
(``StreamingDataLoader(num_threads=N)``) runs each of its N worker passes on one, and a stage
that finishes batches on a thread of its own (a GPU decode, ``k + 1 .. k + depth`` ahead of
batch ``k``) is one over the batches it is given. What it guarantees:

- items come out in the order the iterator made them, at most ``depth`` made ahead;
- an exception raised on the thread is raised on the consumer's thread at its place: after
  every item made before it was handed out, with its own traceback;
- :meth:`BackgroundIterator.close` (also on ``break``, an exception in the consumer, or garbage
  collection) stops the thread at its next item, closes the iterator on that thread (so its
  ``finally`` blocks run where it ran) and joins it; nothing waits forever.

One object per process: what a forked child inherits from its parent is never used.

Thread pools, prefetch queues and buffer pools belong to the process that made them: after a
fork (DataLoader workers) the parent's threads do not exist in the child and its streams are
the parent's. :class:`ProcessLocal` hands each process its own. Locks that background threads
hold are :class:`ProcessLock` s, unlocked in a forked child: a thread of the parent that held
one at the fork (a fetch thread, while a DataLoader forks its workers) does not exist there,
and would hold it forever."""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

__all__ = [
    "BackgroundIterator",
    "ProcessLocal",
    "ProcessLock",
]


T = TypeVar("T")

_ITEM, _END, _ERROR = 0, 1, 2
_POLL_S = 0.1  # how often a blocked side looks whether the other one stopped
_EXIT_WAIT_S = 5.0  # how long the interpreter's exit waits for each stage still running

#: Every stage whose thread may still run: stopped before the interpreter exits, since a
#: daemon thread still inside a torch call at exit aborts the process ("terminate called
#: without an active exception").
_LIVE: weakref.WeakSet[BackgroundIterator[Any]] = weakref.WeakSet()


@atexit.register
def _stop_all_at_exit() -> None:
    for stage in list(_LIVE):
        stage.close(timeout_s=_EXIT_WAIT_S)


class BackgroundIterator(Generic[T]):
    """Iterate ``make()`` on a daemon thread, handing its items out in order.

    Args:
        make: Makes the iterator, on the background thread (so anything it sets up there,
            such as a thread-local context, is the thread's).
        depth: Items made ahead of the consumer (at least 1).
        name: The thread's name (shown in tracebacks and profilers).
        setup: A context manager factory entered on the thread around the whole iteration
            (for example, which worker the thread plays).

    Example:
        >>> with BackgroundIterator(lambda: iter(range(3)), depth=2) as items:
        ...     list(items)
        [0, 1, 2]
    """

    def __init__(
        self,
        make: Callable[[], Iterator[T]],
        depth: int = 2,
        name: str = "shardstream-stage",
        setup: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth must be at least 1, got {depth}")
        self._make, self._setup = make, setup or contextlib.nullcontext
        self._queue: queue.Queue[tuple[int, Any]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        _LIVE.add(self)
        self._thread.start()

    # -- the background thread ----------------------------------------------------------------

    def _run(self) -> None:
        try:
            with self._setup():
                items = self._make()
                try:
                    for item in items:
                        if not self._put((_ITEM, item)):
                            return
                finally:
                    close = getattr(items, "close", None)
                    if close is not None:
                        close()  # on this thread: a generator's finally runs where it ran
        except BaseException as error:  # handed to the consumer, raised there at its place
            self._put((_ERROR, error))
            return
        self._put((_END, None))

    def _put(self, entry: tuple[int, Any]) -> bool:
        """Queue ``entry``; False once the consumer stopped (the entry is dropped)."""
        while not self._stop.is_set():
            try:
                self._queue.put(entry, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    # -- the consumer -------------------------------------------------------------------------

    def __iter__(self) -> BackgroundIterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        while True:
            try:
                kind, value = self._queue.get(timeout=_POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True  # stopped by close(): nothing more comes
                    raise StopIteration from None
        if kind == _ITEM:
            return value
        self._done = True
        self._thread.join()
        if kind == _ERROR:
            raise value
        raise StopIteration

    def stop(self) -> None:
        """Tell the thread to stop at its next item, without waiting (idempotent)."""
        self._done = True
        self._stop.set()
        # Free a thread blocked on a full queue. No queue.Empty handling: this also runs while
        # the interpreter exits (a generator closed then), when module globals may be gone.
        with self._queue.mutex:
            self._queue.queue.clear()
            self._queue.not_full.notify_all()

    def close(self, timeout_s: float | None = None) -> None:
        """Stop the thread at its next item and wait for it (idempotent).

        Args:
            timeout_s: Longest wait for the thread (None: until it stops; an item the
                iterator is making is finished first).
        """
        self.stop()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def running(self) -> bool:
        """Whether the thread is still alive."""
        return self._thread.is_alive()

    def __enter__(self) -> BackgroundIterator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_done", True):
            self._done = True
            self._stop.set()


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

    def __reduce__(self) -> tuple[type[ProcessLock], tuple[()]]:
        # Pickled to a spawned process (a DataLoader worker) with what holds it: a new lock.
        return ProcessLock, ()


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
