"""Per-process values: a forked child and a spawned process (an object pickled to it) each
make their own, and never use the parent's."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from typing import Any

import pytest

from shardstream.storage.processlocal import ProcessLocal, ProcessLock


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


def test_a_fork_while_another_thread_makes_the_value_leaves_the_child_free() -> None:
    """A thread in the middle of making the value holds the lock at the fork; that thread does
    not exist in the child, whose first ``get`` must not wait for it (a DataLoader worker forked
    while a fetch thread took its receive buffers)."""
    entered, release = threading.Event(), threading.Event()

    def make() -> object:
        if not entered.is_set():  # the parent's thread: waits inside make, holding the lock
            entered.set()
            release.wait(30)
        return object()

    local: ProcessLocal[object] = ProcessLocal(make)
    thread = threading.Thread(target=local.get)
    thread.start()
    try:
        assert entered.wait(10)
        pid = os.fork()
        if pid == 0:  # the child: SIGALRM ends it if get() waits
            signal.alarm(10)
            local.get()
            os._exit(0)
    finally:
        release.set()
        thread.join(30)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child waited for a lock nobody holds"


def test_a_process_lock_held_at_a_fork_is_free_in_the_child() -> None:
    lock, held, release = ProcessLock(), threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        pid = os.fork()
        if pid == 0:
            signal.alarm(10)
            with lock:
                os._exit(0)
    finally:
        release.set()
        thread.join(30)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "the child waited for the parent's thread"
