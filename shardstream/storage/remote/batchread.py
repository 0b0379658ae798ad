"""Several small objects read at once: one request latency for all of them, not one each.

A worker that starts reading a window of pieces from a remote store first needs the byte-offset
index of every shard in it. Read one after another, they cost one first-byte delay each;
:func:`read_ranges` sends the reads together, on a small per-process thread pool, so they cost
about one.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from shardstream.storage.processlocal import ProcessLocal
from shardstream.storage.store import Store

__all__ = ["read_ranges"]

#: Reads in flight at once per process.
_MAX_THREADS = 16

_pool: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
    lambda: ThreadPoolExecutor(_MAX_THREADS, thread_name_prefix="shardstream-small-read")
)


def read_ranges(store: Store, ranges: Sequence[tuple[str, int | None]]) -> list[bytes | OSError]:
    """Bytes ``[0, end)`` of each ``(name, end)`` (``end`` None: the whole object), or the
    ``OSError`` (``StorageError`` included) that reading it raised, in the order asked.

    Local files are read in this thread (there is no latency to hide); remote objects together.

    Examples:
        >>> read_ranges(Store("shards/train"), [("shard-000000.idx", None)])  # doctest: +SKIP
    """

    def read(item: tuple[str, int | None]) -> bytes | OSError:
        name, end = item
        try:
            with store.open_read(name, 0, end) as stream:
                return stream.read()
        except OSError as error:
            return error

    if store.is_local or len(ranges) < 2:
        return [read(item) for item in ranges]
    return list(_pool.get().map(read, ranges))
