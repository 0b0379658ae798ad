"""Remote shards read through the local shard cache (``ReadOptions(cache_dir=...)``).

Each shard is downloaded whole into the cache once (one stream of ranged GETs; the worker
processes of a node share the download through the cache's lock) and from then on read as a
local file: pieces are slices of a memory map and cost no request, so a dataset that fits the
cache can be read in the local order (pieces of a few samples from all over the dataset, see
:func:`~shardstream.streaming._planning.order.choose_order`) with every request a whole shard.

Announced pieces start their shards' downloads in the background, soonest first,
:data:`DOWNLOADS` at a time per process; a piece whose shard is not local yet waits for its
download (started then if nothing announced it). What a download found is kept for the pass
(one stat per shard and pass, in the background), so an object rewritten meanwhile is seen by
the next pass, as without a cache. A shard the cache cannot hold (the disk failed) is read as a
remote stream instead.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
from collections.abc import Hashable, Sequence
from typing import IO

from shardstream._storage.backends.localmaps import LocalRanges, WindowMaps
from shardstream._storage.background import ProcessLocal
from shardstream._storage.ranges import StoreLike

__all__ = ["DOWNLOADS", "CachedRanges"]

#: Whole-shard downloads in flight at once per process (each a stream with its read-ahead).
DOWNLOADS = 8

_pool: ProcessLocal[cf.ThreadPoolExecutor] = ProcessLocal(
    lambda: cf.ThreadPoolExecutor(DOWNLOADS, thread_name_prefix="shardstream-cache-fill")
)


class CachedRanges(LocalRanges):
    """A reader's remote files, each downloaded whole into the cache and read as a local file.

    Args:
        store: Where the files are (a remote store whose read options name a ``cache_dir``).
        max_idle: Idle handles of cached files kept open.
        max_map_bytes: Bytes of cached files kept mapped whole until :meth:`close`.
    """

    announces = True

    def __init__(self, store: StoreLike, max_idle: int = 64, max_map_bytes: int = 2 << 30) -> None:
        super().__init__(store, max_idle, max_map_bytes)
        #: This pass's downloads: each shard's cache file (None: not cacheable), or the error.
        self._downloads: dict[str, cf.Future[str | None]] = {}

    def announce(self, ranges: Sequence[tuple[str, int, int]], group: Hashable) -> None:
        """Start downloading the announced ranges' shards (each once per pass), in order."""
        for name, _, _ in ranges:
            if name not in self._downloads and not self._closed:
                self._downloads[name] = _pool.get().submit(self._download, name)

    def forget(self, group: Hashable) -> None:
        """Nothing to drop: a started download fills the cache for whoever reads it next."""

    def open_range(self, name: str, start: int = 0, end: int | None = None) -> IO[bytes]:
        """The shard's cache file positioned at ``start`` (the caller stops at ``end``), once
        its download ended; a remote stream when the cache could not keep it."""
        path = self._cached(name)
        if path is not None:
            with contextlib.suppress(FileNotFoundError):  # evicted meanwhile: download again
                stream = open(path, "rb")  # noqa: SIM115 - lent, closed by LocalRanges
                stream.seek(start)
                return stream
        return super().open_range(name, start, end)

    def view(self, name: str, begin: int, end: int, alone: bool = True) -> memoryview | None:
        """A slice of the cache file's map (see :meth:`LocalRanges.view`); None when the
        shard is not in the cache (read it from the stream then)."""
        if self._cached(name) is None:
            return None
        return super().view(name, begin, end, alone)

    def window_maps(
        self, stream: IO[bytes], boundaries: Sequence[int], stop: int
    ) -> WindowMaps | None:
        """Maps of a cache file's ranges; None for a remote stream (it has no descriptor)."""
        return super().window_maps(stream, boundaries, stop) if _is_file(stream) else None

    def close(self) -> None:
        """Cancel downloads not started yet (those under way finish into the cache)."""
        super().close()
        for future in self._downloads.values():
            future.cancel()

    def _cached(self, name: str) -> str | None:
        """The shard's cache file once downloaded (downloading it now if not announced)."""
        future = self._downloads.get(name)
        if future is None or future.cancelled():
            future = self._downloads[name] = cf.Future()
            future.set_result(self._download(name))
        return future.result()  # a failed download raises here, where the shard is read

    def _download(self, name: str) -> str | None:
        """Fill the cache with ``name`` (or find it there): its cache file, or None."""
        stream = super().open_range(name)
        with stream:
            path = getattr(stream, "name", None)
            return path if isinstance(path, str) and _is_file(stream) else None


def _is_file(stream: IO[bytes]) -> bool:
    """Whether ``stream`` is a local file (a cache entry) rather than a remote stream."""
    try:
        stream.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both
        return False
    return True
