"""Reading remote objects: ranged requests, retried and resumed, fetched ahead in parallel.

:func:`open_remote` is what every remote backend's ``open_read`` uses. With a cache it asks for
the object's size and version, downloads a missing object into the cache and opens the local
file. Otherwise it streams the wanted byte range through a
:class:`~shardstream._storage.remote.ranged.ExtentFetcher` (retries, resume at the byte offset
reached) and prefetches, never past the end of the range. Where the backend's answers tell the
object's size and version (``Backend.sizes_from_gets``: S3's ``Content-Range`` and ``ETag``)
no stat is made, and later requests are conditional on that version so a rewritten object is
never mixed with the old one.

Where the backend's ranged reads may run at once (``Backend.pooled_reads``), a bounded range (a
piece of a shard) opens with one short request, and the rest is fetched as spans by the
process's shared pool of threads (:mod:`~shardstream._storage.remote.prefetch`), so several
requests are in flight while the caller decodes and opens other pieces; how many follows the
store's measured first-byte latency (:mod:`~shardstream._storage.remote.prefetch`), and announced
ranges are fetched before they are opened (:mod:`~shardstream._storage.remote.prefetch`).
Open-ended reads prefetch in one background thread
(:class:`~shardstream._storage.remote.ranged.ReadAhead`). Nothing here is created before it
is first used in a process, so DataLoader workers that fork after the dataset was built get
clients and threads of their own.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Hashable, Sequence
from typing import IO, Any, cast

from shardstream._storage.background import ProcessLocal
from shardstream._storage.options import ReadOptions
from shardstream._storage.ranges import BoundedFile
from shardstream._storage.remote import prefetch as hints
from shardstream._storage.remote.cache import ShardCache
from shardstream._storage.remote.prefetch import SpanPrefetcher, pool_for, span_fetch
from shardstream._storage.remote.ranged import (
    Extent,
    ExtentFetcher,
    ExtentSource,
    ReadAhead,
    RemoteStream,
)
from shardstream._storage.remote.retry import Retrier

__all__ = ["open_remote", "prefetch_remote"]

_MIN_EXTENT_BYTES = 256 * 2**10
_MAX_EXTENT_BYTES = 8 * 2**20
#: First ranged GET after a seek; later ones double up to the extent size.
_FIRST_SPAN_BYTES = 2**20
#: First ranged GET after an open: readers often peek at byte 0 and then seek to a piece.
_OPEN_SPAN_BYTES = 64 * 2**10
#: First GET of a bounded range that is prefetched: the rest is fetched by the pool meanwhile.
_RANGE_OPEN_BYTES = 2**20
#: A bounded range up to this size is asked for in one GET: the second GET of a split would
#: save a few milliseconds of transfer and cost a request (CPU, and a store's request count).
_RANGE_WHOLE_BYTES = 4 * 2**20
#: First GET of an announced range longer than ``_RANGE_WHOLE_BYTES``: its first samples arrive
#: without waiting for the rest (a shuffled batch takes a few samples from each of dozens of
#: pieces: waiting for each long piece whole would hold the first batch of an epoch until
#: hundreds of MB had arrived). Shorter announced ranges are one GET, as opened ones are: the
#: prefetch budget bounds what a first batch waits for, and a split would halve the mean request.
_ANNOUNCED_FIRST_SPAN_BYTES = 512 * 2**10
#: First GET of each of a process's first ``ReadOptions.max_requests`` announced ranges longer
#: than ``_RANGE_OPEN_BYTES`` (shorter ones are read whole at once). A fresh worker's first
#: batch takes a sample or two from each of dozens of pieces, read sample by sample: it waits
#: for their first bytes, not for whole pieces (64 pieces of 2 MiB are 128 MiB to move before
#: it; 64 openings of 256 KiB, 16 MiB). Such a range counts this much against the prefetch
#: budget, so all of them start at once, and its rest is asked for when half its opening has
#: been read (one more GET, once per process and piece; later ranges are one GET, as above):
#: the first batch's few samples per piece ask for no rest, and so share the store with nothing.
_COLD_OPENING_BYTES = 256 * 2**10

#: Ranges this process announced so far (a forked worker counts its own).
_num_announced: ProcessLocal[itertools.count[int]] = ProcessLocal(itertools.count)


def _extent_bytes(read_ahead_bytes: int) -> int:
    """Longest ranged GET, each read whole as one extent (see :func:`open_remote`)."""
    if read_ahead_bytes <= 0:
        return _MAX_EXTENT_BYTES
    return max(_MIN_EXTENT_BYTES, min(_MAX_EXTENT_BYTES, read_ahead_bytes // 4))


def _stat(source: Any, retrier: Retrier) -> tuple[int, str | None]:
    while True:
        try:
            size, etag = source.stat()
        except Exception as exc:  # classified by the retrier: retry, or raise clearly
            retrier.failed(exc, 0)
            continue
        retrier.succeeded()
        return size, etag


def _download(cache: ShardCache, path: str, fetcher: ExtentFetcher) -> IO[bytes] | None:
    """Fetch the whole object into the cache (once per process and folder); open the entry."""
    size = fetcher.size
    if size is None:  # the cache is keyed on the size; unknown here, so read directly
        return None
    with cache.lock(path):
        hit = cache.open_cached(path, size)
        if hit is not None:
            return hit
        writer = cache.start(path, size)
        if writer is None:
            return None
        try:
            while (extent := fetcher.next_extent()) is not None:
                writer.write(extent)
        except BaseException:
            writer.abort()
            raise
        finally:
            fetcher.close()
        writer.commit()
    return cache.open_cached(path, size)


def open_remote(
    backend: Any,
    fs: Any,
    path: str,
    shown: str,
    secrets: list[str],
    options: ReadOptions,
    start: int = 0,
    end: int | None = None,
) -> IO[bytes]:
    """Open bytes ``[start, end)`` of a remote object with retries, read-ahead and a cache.

    Without a cache the range streams through a seekable :class:`RemoteStream` that never
    fetches past ``end``; where answers tell the size (S3) the first ranged GET is made here
    (it raises ``FileNotFoundError`` for a missing object), so no stat is needed. With
    ``options.cache_dir`` a miss downloads the whole object into the cache first
    (retried and resumed like any read; one download per shard even when many pieces of it are
    opened) and every open returns the local file, so later epochs never touch the network.

    Args:
        backend: The store's backend (its ``range_source`` and what its reads can do).
        fs: The filesystem from the backend's ``read_filesystem``.
        path: The object's path on ``fs``.
        shown: The object's URL without credentials, for messages.
        secrets: Secret values to scrub from messages.
        options: Retries, read-ahead and cache.
        start: First byte to read.
        end: Stop before this byte (``None``: the object's end).

    Returns:
        A read-only, seekable binary file object positioned at ``start``.
    """
    if end is not None and (ahead := hints.take(hints.range_key(fs, path, start, end))):
        return ahead  # announced by prefetch_remote: already under way
    source = backend.range_source(fs, path, options)
    stop = threading.Event()
    retrier = Retrier.for_options(shown, "reading", options, secrets, stop)
    size: int | None = end
    if options.cache_dir or not backend.sizes_from_gets:
        size, etag = _stat(source, retrier)
        if options.cache_dir:
            cache = ShardCache(options.cache_dir, options.cache_max_bytes)
            local = _open_cached(cache, source, size, etag, shown, retrier)
            if local is not None:
                local.seek(start)
                return local if end is None else BoundedFile(local, end)  # type: ignore[return-value]
            stop.clear()  # too big for the cache, or the disk failed: stream it instead
        size = size if end is None else min(size, end)
    return _stream_range(backend, source, size, start, end, shown, retrier, options)


def prefetch_remote(
    backend: Any,
    fs: Any,
    ranges: Sequence[tuple[str, str, int, int]],
    secrets: list[str],
    options: ReadOptions,
    group: Hashable,
) -> None:
    """Announce ``(path, shown, start, end)`` ranges that will be opened soon, soonest first.

    Where the backend's reads can be pooled (without a cache, with read-ahead on) up to
    ``options.prefetch_bytes`` of them are fetched in the background (see
    :mod:`~shardstream._storage.remote.prefetch`), and :func:`open_remote` of the same range hands
    over the stream already under way. ``group`` (one per caller, e.g. one per stream of
    pieces) replaces that group's earlier announcements. Elsewhere a no-op. An announced range
    that fails is not reported here: its open retries and raises as usual.
    """
    if not backend.pooled_reads or options.cache_dir or options.read_ahead_bytes <= 0:
        return
    if options.prefetch_bytes <= 0:
        return
    counter = _num_announced.get()
    entries = []
    for path, shown, start, end in ranges:
        if end <= start:
            continue
        # The first pieces a process reads: what its first batch waits on.
        first = next(counter) < options.max_requests
        cold = first and end - start > _RANGE_OPEN_BYTES
        entries.append((
            hints.range_key(fs, path, start, end),
            min(end - start, _COLD_OPENING_BYTES) if cold else end - start,
            functools.partial(_open_ahead, backend, fs, path, shown, secrets, options, start,
                              end, first),
        ))  # fmt: skip
    hints.process_queue(options.prefetch_bytes).hint(group, entries)


def _open_ahead(
    backend: Any, fs: Any, path: str, shown: str, secrets: list[str], options: ReadOptions,
    start: int, end: int, first: bool = False,
) -> IO[bytes]:  # fmt: skip
    """A stream of ``[start, end)`` whose spans are submitted to the pool now (no waiting).

    Unlike :func:`open_remote` nothing is fetched in the caller's thread: a missing object
    raises on the first read. The object may be shorter than ``end``: reads then end early.
    ``first`` (one of the process's first pieces): its opening goes to the pool's cold tier,
    which runs before any other span and alone; of a range over ``_RANGE_OPEN_BYTES`` only the
    first ``_COLD_OPENING_BYTES`` are submitted now, the rest once half of them is read.
    """
    cold = first and end - start > _RANGE_OPEN_BYTES
    stop = threading.Event()
    retrier = Retrier.for_options(shown, "reading", options, secrets, stop)
    source = backend.range_source(fs, path, options)
    pool = pool_for(options)
    opening = end - start if end - start <= _RANGE_WHOLE_BYTES else _ANNOUNCED_FIRST_SPAN_BYTES
    extents = SpanPrefetcher(
        span_fetch(source, retrier, pool.gauge), start, end,
        _extent_bytes(options.read_ahead_bytes), 0 if cold else options.read_ahead_bytes, pool,
        stop, first_span_bytes=min(opening, _COLD_OPENING_BYTES) if cold else opening,
        hold_rest=cold, cold=first,
    )  # fmt: skip
    return cast(IO[bytes], RemoteStream(extents, shown, end, start))


def _open_cached(
    cache: ShardCache, source: Any, size: int, etag: str | None, shown: str, retrier: Retrier
) -> IO[bytes] | None:
    most = _MAX_EXTENT_BYTES
    whole = ExtentFetcher(source, size, most, retrier, first_span_bytes=most)
    return _download(cache, cache.path_for(shown, size, etag), whole)


def _stream_range(
    backend: Any,
    source: Any,
    size: int | None,
    start: int,
    end: int | None,
    shown: str,
    retrier: Retrier,
    options: ReadOptions,
) -> IO[bytes]:
    """Stream ``[start, end)``; ``size`` is None (S3) until the first GET says it."""
    # A ranged GET is never longer than an extent, so every response is read to its end at once:
    # no connection sits idle in a half-read body (many pieces open at once would exhaust the
    # pool and stall), and finished responses go back to the pool for reuse (keep-alive).
    extent_bytes = _extent_bytes(options.read_ahead_bytes)
    first_span_bytes = min(_FIRST_SPAN_BYTES, extent_bytes)
    fetcher = ExtentFetcher(
        source, size, extent_bytes, retrier, first_span_bytes, extent_bytes, start, end
    )
    spans = backend.pooled_reads and end is not None and options.read_ahead_bytes > 0
    # A known range is asked for whole (up to an extent), or, when the pool fetches the rest of a
    # long one, its first MiB; an open-ended read starts small, since readers often peek and
    # then seek.
    opening = _OPEN_SPAN_BYTES if end is None else max(1, end - start)
    split = spans and opening > _RANGE_WHOLE_BYTES
    fetcher.next_span_bytes = min(opening, extent_bytes, _RANGE_OPEN_BYTES if split else opening)
    head: Extent = b""
    if backend.sizes_from_gets:
        head = fetcher.next_extent() or b""  # learns the size (and version) without a stat
    total = fetcher.size if fetcher.size is not None else start
    extents: ExtentSource = fetcher
    if spans and total > fetcher.offset:
        pool = pool_for(options)
        extents = SpanPrefetcher(
            span_fetch(source, retrier, pool.gauge), fetcher.offset, total, extent_bytes,
            options.read_ahead_bytes, pool, retrier.stop,
        )  # fmt: skip
    elif options.read_ahead_bytes > 0 and total - fetcher.offset > extent_bytes:
        extents = ReadAhead(extents, options.read_ahead_bytes, extent_bytes, retrier.stop)
    return cast(IO[bytes], RemoteStream(extents, shown, total, start, head))
