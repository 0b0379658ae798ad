"""Running tasks (build chunks, index batches): in-process, on local processes, or on any
user-supplied executor.

At most ``2 * workers`` tasks are in flight, so memory stays constant however many tasks a job
has. Results are handed back in completion order; callers order them by task number.

Builds spread over an existing engine: one partition per task, then one merge.

Spark's ``mapPartitions``, Ray Data's ``map_batches`` or a SLURM array task call
:func:`~shardstream.write_partition` on their part of the samples; when all are
done, :func:`merge_partitions` writes the dataset's manifest. Each partition is a complete small
dataset in its own folder ``DEST/part-NNNNN`` (shards, indexes and a manifest written last, as
``build_shards`` writes them), so a task that is retried overwrites exactly its own shards and
can never duplicate samples, and a task that died half-way leaves no manifest behind: the merge
names it. The merged manifest lists every partition's shards under their folders
(``part-00003/shard-000000.tar``); no shard is copied or renamed, so the merge costs one
manifest read per partition.

Keys must be unique across partitions (as in one build): give each partition its own keys,
for example by prefixing them with the partition's number or its source files' names."""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import ctypes
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.context import BaseContext
from typing import Any, TypeVar

from shardstream._format.inspection import write_timm_info
from shardstream._format.manifest import Manifest, ShardInfo, read_manifest, write_manifest
from shardstream._format.shardtable import ShardTable
from shardstream._storage import Store
from shardstream._version import __version__
from shardstream.errors import ConfigError, ManifestNotFoundError

__all__ = [
    "merge_partitions",
    "partition_folder",
    "run_tasks",
]


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


PARTITION_PREFIX = "part-"


def partition_folder(partition: int) -> str:
    """The folder of partition ``partition`` inside the dataset folder.

    Examples:
        >>> partition_folder(3)
        'part-00003'
    """
    if partition < 0:
        raise ConfigError(f"a partition number is 0 or more, got {partition}")
    return f"{PARTITION_PREFIX}{partition:05d}"


def merge_partitions(
    dest: str | os.PathLike[str],
    num_partitions: int | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    class_names: Iterable[str] | None = None,
) -> Manifest:
    """Write ``dest``'s manifest over every finished partition, in partition order.

    Args:
        dest: The dataset folder or URL the partitions were written into.
        num_partitions: How many partitions there must be (0..N-1); ``None`` takes every
            ``part-NNNNN`` folder found, and still refuses gaps in the numbering.
        storage_options: fsspec options for ``dest``.
        class_names: The dataset's class names, when the partitions' samples carry labels
            but the partitions could not know all names; by default the partitions' own (they
            must agree).

    Raises:
        ManifestNotFoundError: A partition has no manifest (it did not finish: run it again).
        ConfigError: No partitions, gaps in the numbering, or partitions with other class names.
    """
    store = Store(dest, storage_options)
    numbers = _partition_numbers(store, num_partitions)
    parts: list[tuple[str, Manifest]] = []
    unfinished = []
    for number in numbers:
        folder = partition_folder(number)
        try:
            parts.append((folder, read_manifest(store.child(folder))))
        except ManifestNotFoundError:
            unfinished.append(folder)
    if unfinished:
        raise ManifestNotFoundError(
            f"{store.shown()}: {len(unfinished)} partition(s) did not finish, such as "
            f"{', '.join(unfinished[:5])}: run their tasks again, then merge"
        )
    names = _class_names(parts, class_names, store)
    shards = ShardTable.of(
        ShardInfo(
            f"{folder}/{shard.name}",
            shard.num_samples,
            shard.num_bytes,
            shard.sha256,
            f"{folder}/{shard.index}" if shard.index is not None else None,
        )
        for folder, part in parts
        for shard in part.shards
    )
    manifest = Manifest(
        shards=shards,
        class_names=names,
        settings={"partitions": len(parts), **dict(parts[0][1].settings)},
        skipped=tuple(item for _, part in parts for item in part.skipped),
        created_by=f"shardstream {__version__} merge",
    )
    write_timm_info(store, manifest)
    write_manifest(store, manifest)
    return manifest


def _partition_numbers(store: Store, expected: int | None) -> list[int]:
    """The partitions to merge: 0..expected-1, or the folders found, refusing gaps."""
    if expected is not None:
        if expected < 1:
            raise ConfigError(f"num_partitions must be 1 or more, got {expected}")
        return list(range(expected))
    found = sorted(
        int(name[len(PARTITION_PREFIX) :])
        for name in store.list_folders()
        if name.startswith(PARTITION_PREFIX) and name[len(PARTITION_PREFIX) :].isdigit()
    )
    if not found:
        raise ConfigError(f"{store.shown()}: holds no partitions ({PARTITION_PREFIX}NNNNN)")
    missing = sorted(set(range(found[-1] + 1)) - set(found))
    if missing:
        shown = ", ".join(partition_folder(number) for number in missing[:5])
        raise ConfigError(
            f"{store.shown()}: partitions missing from the numbering, such as {shown}: run "
            "their tasks, or pass num_partitions to say how many there are"
        )
    return found


def _class_names(
    parts: list[tuple[str, Manifest]], given: Iterable[str] | None, store: Store
) -> tuple[str, ...] | None:
    if given is not None:
        return tuple(given)
    named = {part.class_names for _, part in parts if part.class_names is not None}
    if len(named) > 1:
        raise ConfigError(
            f"{store.shown()}: partitions name their classes differently; pass class_names "
            "to merge_partitions with the dataset's names"
        )
    return named.pop() if named else None
