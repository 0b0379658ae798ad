"""Per-process values: a forked child and a spawned process (an object pickled to it) each
make their own, and never use the parent's."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

import pytest

from shardstream._storage.background import ProcessLocal, ProcessLock


class _Holder:
    """An object with a per-process value, as a dataset holds its reader."""

    def __init__(self) -> None:
        self.local: ProcessLocal[int] = ProcessLocal(self._make)

    def _make(self) -> int:
        return os.getpid()


def _report(holder: _Holder, queue: Any) -> None:
    queue.put((holder.local.peek(), holder.local.get(), os.getpid()))


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_another_process_makes_its_own_value(method: str) -> None:
    holder = _Holder()
    assert holder.local.get() == os.getpid() and holder.local.peek() == os.getpid()
    context = multiprocessing.get_context(method)
    queue = context.Queue()
    process = context.Process(target=_report, args=(holder, queue))
    process.start()
    peeked, made, pid = queue.get(timeout=120)
    process.join(timeout=120)
    assert (peeked, made) == (None, pid) and pid != os.getpid()
    assert holder.local.get() == os.getpid()  # the parent's value is untouched


def _fork_while_held(hold: Callable[[threading.Event, threading.Event], None],
                     in_child: Callable[[], None]) -> int:  # fmt: skip
    """Fork while a thread runs ``hold(held, release)`` (it sets ``held``, then waits for
    ``release`` holding a lock); the child's exit code after ``in_child()`` (SIGALRM: it hung)."""
    held, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=hold, args=(held, release))
    thread.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: SIGALRM ends it if in_child() waits
            signal.alarm(10)
            in_child()
            os._exit(0)
    finally:
        release.set()
        thread.join(30)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_fork_while_another_thread_makes_the_value_leaves_the_child_free() -> None:
    """A thread in the middle of making the value holds the lock at the fork; that thread does
    not exist in the child, whose first ``get`` must not wait for it (a DataLoader worker forked
    while a fetch thread took its receive buffers)."""
    events: dict[str, threading.Event] = {}

    def make() -> object:
        if events:  # the parent's thread: waits inside make, holding the lock
            held, release = events.pop("held"), events.pop("release")
            held.set()
            release.wait(30)
        return object()

    local: ProcessLocal[object] = ProcessLocal(make)

    def hold(held: threading.Event, release: threading.Event) -> None:
        events.update(held=held, release=release)
        local.get()

    assert _fork_while_held(hold, local.get) == 0, "the child waited for a lock nobody holds"


def test_a_process_lock_held_at_a_fork_is_free_in_the_child() -> None:
    lock = ProcessLock()

    def hold(held: threading.Event, release: threading.Event) -> None:
        with lock:
            held.set()
            release.wait(30)

    def take() -> None:
        with lock:
            pass

    assert _fork_while_held(hold, take) == 0, "the child waited for the parent's thread"


def test_a_process_lock_pickles_as_a_new_unlocked_lock() -> None:
    import pickle

    lock = ProcessLock()
    with lock:
        copy = pickle.loads(pickle.dumps(lock))  # what a spawned DataLoader worker receives
    assert isinstance(copy, ProcessLock) and copy is not lock
    with copy:
        pass
