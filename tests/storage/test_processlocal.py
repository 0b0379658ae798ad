"""Per-process values: a forked child and a spawned process (an object pickled to it) each
make their own, and never use the parent's."""

from __future__ import annotations

import multiprocessing
import os
from typing import Any

import pytest

from shardstream.storage.processlocal import ProcessLocal


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
