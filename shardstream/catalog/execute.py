"""Running tasks (build chunks, index batches): in-process, on local processes, or on any
user-supplied executor.

At most ``2 * workers`` tasks are in flight, so memory stays constant however many tasks a job
has. Results are handed back in completion order; callers order them by task number.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext
from typing import TypeVar

from shardstream.errors import ConfigError

__all__ = ["run_tasks"]

Task = TypeVar("Task")
Result = TypeVar("Result")


def run_tasks(
    function: Callable[[Task], Result],
    tasks: Iterable[Task],
    on_result: Callable[[Result], None],
    workers: int = 1,
    executor: cf.Executor | None = None,
) -> None:
    """Run ``function`` on every task and call ``on_result`` with each result as it completes.

    With no ``executor`` and ``workers == 1`` tasks run in this process; with ``workers > 1``
    a local process pool is started (and shut down) here. A given executor is used as is and
    left running. ``function`` and the tasks must pickle (a module-level function).
    """
    if executor is None and workers == 1:
        for task in tasks:
            on_result(function(task))
        return
    own = executor is None
    context = _process_context()
    pool = executor or cf.ProcessPoolExecutor(
        max_workers=workers,
        mp_context=context,
        initializer=_exit_with_parent,
        initargs=(os.getpid(),),
    )
    try:
        _submit_bounded(pool, function, tasks, on_result, max_in_flight=2 * workers)
    except BrokenProcessPool as error:
        if not own:
            raise
        raise ConfigError(_broken_pool_advice(context.get_start_method())) from error
    finally:
        if own:
            pool.shutdown(wait=True, cancel_futures=True)


def _broken_pool_advice(start_method: str) -> str:
    """What to do when a local worker process died: the likely cause for this start method."""
    died = "a build worker process died"
    if start_method == "spawn":
        return (
            f"{died}. This process runs other threads (after `import torch`, for example), so "
            "workers are started with 'spawn' and each re-imports your main script: put the "
            'call under `if __name__ == "__main__":` (or pass workers=1). If the script has '
            "that guard, a worker was killed, for example by the OS when memory ran out."
        )
    return (
        f"{died} (killed, for example by the OS when memory ran out: fewer workers, or "
        "smaller shards, use less)"
    )


def _process_context() -> BaseContext:
    """``fork`` where it is safe (Linux, no other threads), else ``spawn``.

    Forked workers start in milliseconds and need neither an ``if __name__ == "__main__"`` guard
    nor a re-import of the caller's main module (which often imports torch: seconds per worker).
    Forking a process that runs other threads can deadlock a child, so then spawn is used.
    """
    if "fork" in multiprocessing.get_all_start_methods() and threading.active_count() == 1:
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context("spawn")


def _exit_with_parent(parent: int) -> None:
    """Worker initializer: end this worker when the building process dies (Linux).

    A pool worker otherwise outlives a killed build, waiting forever for work. The kernel sends
    SIGTERM when the process that started the worker exits; one that died before this ran is
    caught by the parent check.
    """
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(1)


def _submit_bounded(
    pool: cf.Executor,
    function: Callable[[Task], Result],
    tasks: Iterable[Task],
    on_result: Callable[[Result], None],
    max_in_flight: int,
) -> None:
    pending: set[cf.Future[Result]] = set()
    try:
        for task in tasks:
            pending.add(pool.submit(function, task))
            if len(pending) >= max_in_flight:
                done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                for future in done:
                    on_result(future.result())
        for future in cf.as_completed(pending):
            on_result(future.result())
    except BaseException:
        for future in pending:
            future.cancel()
        raise
