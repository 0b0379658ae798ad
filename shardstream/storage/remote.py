"""Reading remote objects: few, long ranged GETs per shard on S3, chunked ranges elsewhere.

:func:`open_remote` is what :meth:`Store.open_read` uses for every non-local URL. With a cache it
asks for the object's size and ETag (HEAD), downloads a missing object into the cache and opens
the local file. Otherwise it streams the wanted byte range through a
:class:`~shardstream.storage.ranged.ChunkFetcher` (retries, resume at the byte offset reached) and
prefetches, never past the end of the range. On S3 that stream makes no HEAD: the first ranged
GET's ``Content-Range`` and ``ETag`` give the size and version, and later GETs carry ``If-Match``
on that ETag so a rewritten object is never mixed with the old one.

A bounded range on S3 (a piece of a shard) opens with one short GET, and the rest is fetched as
spans by the process's shared pool of threads (:mod:`shardstream.storage.prefetch`), so several
GETs are in flight while the caller decodes and opens other pieces; how many follows the store's
measured first-byte latency (:mod:`shardstream.storage.latency`). Open-ended reads prefetch in
one background thread (:class:`~shardstream.storage.readahead.ReadAhead`).

On S3 the requests go out on botocore's synchronous client (:mod:`shardstream.storage.s3sync`,
built from the s3fs filesystem's settings) or, for filesystems it cannot mirror, on s3fs's
aiobotocore client; botocore's own retries are off either way: the retry loop here is the only
one, which keeps the total budget equal to ``ReadOptions.max_attempts``. Nothing here is created
before it is first used in a process, so DataLoader workers that fork after the dataset was
built get clients and threads of their own.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Hashable, Mapping, Sequence
from typing import IO, Any, cast

import fsspec

from shardstream.storage import hints
from shardstream.storage.bounded import BoundedFile
from shardstream.storage.cache import ShardCache
from shardstream.storage.options import ReadOptions
from shardstream.storage.prefetch import SpanPrefetcher, pool_for, span_fetch
from shardstream.storage.ranged import Chunk, ChunkFetcher, ChunkSource, RemoteStream
from shardstream.storage.readahead import ReadAhead
from shardstream.storage.retry import Retrier
from shardstream.storage.s3source import S3Source
from shardstream.storage.s3sync import sync_client

__all__ = ["forget_remote", "open_remote", "prefetch_remote", "read_filesystem"]

_S3_PROTOCOLS = frozenset({"s3", "s3a"})
_MIN_CHUNK_BYTES = 256 * 2**10
_MAX_CHUNK_BYTES = 8 * 2**20
#: First ranged GET after a seek; later ones double up to the chunk size.
_FIRST_SPAN_BYTES = 2**20
#: First ranged GET after an open: readers often peek at byte 0 and then seek to a piece.
_OPEN_SPAN_BYTES = 64 * 2**10
#: First GET of a bounded range that is prefetched: the rest is fetched by the pool meanwhile.
_RANGE_OPEN_BYTES = 2**20
#: A bounded range up to this size is asked for in one GET: the second GET of a split would
#: save a few milliseconds of transfer and cost a request (CPU, and a store's request count).
_RANGE_WHOLE_BYTES = 4 * 2**20
#: First GET of an announced range: its first samples arrive without waiting for the rest (a
#: shuffled batch takes a few samples from each of dozens of pieces: waiting for each piece
#: whole would hold the first batch of an epoch until hundreds of MB had arrived).
_ANNOUNCED_FIRST_SPAN_BYTES = 512 * 2**10


def read_filesystem(
    url: str, storage_options: Mapping[str, Any] | None, timeout_s: float
) -> tuple[Any, str]:
    """``(filesystem, path)`` for reading ``url``, with client-side retries off on S3."""
    options = dict(storage_options or {})
    if url.split("://", 1)[0].lower() in _S3_PROTOCOLS:
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})  # the Retrier owns retries
        config.setdefault("read_timeout", timeout_s)
        config.setdefault("connect_timeout", timeout_s)
        options["config_kwargs"] = config
    return fsspec.core.url_to_fs(url, **options)


class _RangeBody:
    def __init__(self, fs: Any, path: str, offset: int, end: int) -> None:
        self._fs, self._path, self._offset, self._end = fs, path, offset, end

    def read_chunk(self, num_bytes: int) -> bytes:
        end = min(self._offset + num_bytes, self._end)
        data = bytes(self._fs.cat_file(self._path, start=self._offset, end=end))
        self._offset += len(data)
        return data

    def close(self) -> None:
        """Nothing is held between ranged requests."""


class _GenericSource:
    """Any other fsspec filesystem: one ranged ``cat_file`` per chunk."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs, self.path = fs, path

    def stat(self) -> tuple[int, str | None]:
        info = self.fs.info(self.path)
        version = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("created")
        return int(info["size"]), (str(version) if version is not None else None)

    def open_body(self, offset: int, end: int) -> _RangeBody:
        return _RangeBody(self.fs, self.path, offset, end)


def _chunk_bytes(read_ahead_bytes: int) -> int:
    """Longest ranged GET, each read whole as one chunk (see :func:`open_remote`)."""
    if read_ahead_bytes <= 0:
        return _MAX_CHUNK_BYTES
    return max(_MIN_CHUNK_BYTES, min(_MAX_CHUNK_BYTES, read_ahead_bytes // 4))


def _stat(source: Any, retrier: Retrier) -> tuple[int, str | None]:
    while True:
        try:
            size, etag = source.stat()
        except Exception as exc:  # classified by the retrier: retry, or raise clearly
            retrier.failed(exc, 0)
            continue
        retrier.succeeded()
        return size, etag


def _download(cache: ShardCache, path: str, fetcher: ChunkFetcher) -> IO[bytes] | None:
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
            while (chunk := fetcher.next_chunk()) is not None:
                writer.write(chunk)
        except BaseException:
            writer.abort()
            raise
        finally:
            fetcher.close()
        writer.commit()
    return cache.open_cached(path, size)


def open_remote(
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
    fetches past ``end``; on S3 the first ranged GET is made here (it raises
    ``FileNotFoundError`` for a missing object) and tells the size and ETag, so no HEAD is
    needed. With ``options.cache_dir`` a miss downloads the whole object into the cache first
    (retried and resumed like any read; one download per shard even when many pieces of it are
    opened) and every open returns the local file, so later epochs never touch the network.

    Args:
        fs: The filesystem from :func:`read_filesystem`.
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
    is_s3 = _is_s3(fs)
    source: Any = _s3_source(fs, path, options) if is_s3 else _GenericSource(fs, path)
    stop = threading.Event()
    retrier = Retrier(
        shown, "reading", options.max_attempts, options.backoff_s, options.max_backoff_s,
        secrets, stop,
    )  # fmt: skip
    size: int | None = end
    if options.cache_dir or not is_s3:
        size, etag = _stat(source, retrier)
        if options.cache_dir:
            cache = ShardCache(options.cache_dir, options.cache_max_bytes)
            local = _open_cached(cache, source, size, etag, shown, retrier)
            if local is not None:
                local.seek(start)
                return local if end is None else BoundedFile(local, end)  # type: ignore[return-value]
            stop.clear()  # too big for the cache, or the disk failed: stream it instead
        size = size if end is None else min(size, end)
    return _stream_range(source, size, start, end, shown, retrier, options)


def _is_s3(fs: Any) -> bool:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return bool(protocols & _S3_PROTOCOLS)


def _s3_source(fs: Any, path: str, options: ReadOptions) -> S3Source:
    connections = options.max_requests + 8  # the pool's, and callers' own GETs
    client = sync_client(fs, options.timeout_s, connections)
    return S3Source(fs, path, options.timeout_s, client)


def prefetch_remote(
    fs: Any,
    ranges: Sequence[tuple[str, str, int, int]],
    secrets: list[str],
    options: ReadOptions,
    group: Hashable,
) -> None:
    """Announce ``(path, shown, start, end)`` ranges that will be opened soon, soonest first.

    On S3 (without a cache, with read-ahead on) up to ``options.prefetch_bytes`` of them are
    fetched in the background (see :mod:`shardstream.storage.hints`), and :func:`open_remote`
    of the same range hands over the stream already under way. ``group`` (one per caller, e.g.
    one per stream of pieces) replaces that group's earlier announcements. Elsewhere a no-op.
    An announced range that fails is not reported here: its open retries and raises as usual.
    """
    if not _is_s3(fs) or options.cache_dir or options.read_ahead_bytes <= 0:
        return
    if options.prefetch_bytes <= 0:
        return
    entries = [
        (hints.range_key(fs, path, start, end), end - start,
         functools.partial(_open_ahead, fs, path, shown, secrets, options, start, end))
        for path, shown, start, end in ranges
        if end > start
    ]  # fmt: skip
    hints.process_queue(options.prefetch_bytes).hint(group, entries)


def forget_remote(group: Hashable) -> None:
    """Drop what :func:`prefetch_remote` announced for ``group`` and close its streams."""
    hints.forget(group)


def _open_ahead(
    fs: Any, path: str, shown: str, secrets: list[str], options: ReadOptions, start: int, end: int
) -> IO[bytes]:
    """A stream of ``[start, end)`` whose spans are submitted to the pool now (no waiting).

    Unlike :func:`open_remote` nothing is fetched in the caller's thread: a missing object
    raises on the first read. The object may be shorter than ``end``: reads then end early.
    """
    stop = threading.Event()
    retrier = Retrier(
        shown, "reading", options.max_attempts, options.backoff_s, options.max_backoff_s,
        secrets, stop,
    )  # fmt: skip
    source = _s3_source(fs, path, options)
    pool = pool_for(options)
    chunks = SpanPrefetcher(
        span_fetch(source, retrier, pool.gauge), start, end,
        _chunk_bytes(options.read_ahead_bytes), options.read_ahead_bytes, pool, stop,
        first_span_bytes=_ANNOUNCED_FIRST_SPAN_BYTES,
    )  # fmt: skip
    return cast(IO[bytes], RemoteStream(chunks, shown, end, start))


def _open_cached(
    cache: ShardCache, source: Any, size: int, etag: str | None, shown: str, retrier: Retrier
) -> IO[bytes] | None:
    whole = ChunkFetcher(source, size, _MAX_CHUNK_BYTES, retrier, first_span_bytes=_MAX_CHUNK_BYTES)
    return _download(cache, cache.path_for(shown, size, etag), whole)


def _stream_range(
    source: Any,
    size: int | None,
    start: int,
    end: int | None,
    shown: str,
    retrier: Retrier,
    options: ReadOptions,
) -> IO[bytes]:
    """Stream ``[start, end)``; ``size`` is None on S3 until the first GET says it."""
    # A ranged GET is never longer than a chunk, so every response is read to its end at once:
    # no connection sits idle in a half-read body (many pieces open at once would exhaust the
    # pool and stall), and finished responses go back to the pool for reuse (keep-alive).
    chunk_bytes = _chunk_bytes(options.read_ahead_bytes)
    first_span_bytes = min(_FIRST_SPAN_BYTES, chunk_bytes)
    fetcher = ChunkFetcher(
        source, size, chunk_bytes, retrier, first_span_bytes, chunk_bytes, start, end
    )
    is_s3 = isinstance(source, S3Source)
    spans = is_s3 and end is not None and options.read_ahead_bytes > 0
    # A known range is asked for whole (up to a chunk), or, when the pool fetches the rest of a
    # long one, its first MiB; an open-ended read starts small, since readers often peek and
    # then seek.
    opening = _OPEN_SPAN_BYTES if end is None else max(1, end - start)
    split = spans and opening > _RANGE_WHOLE_BYTES
    fetcher.next_span_bytes = min(opening, chunk_bytes, _RANGE_OPEN_BYTES if split else opening)
    head: Chunk = b""
    if is_s3:
        head = fetcher.next_chunk() or b""  # learns the size (and ETag) without a HEAD
    total = fetcher.size if fetcher.size is not None else start
    chunks: ChunkSource = fetcher
    if spans and total > fetcher.offset:
        pool = pool_for(options)
        chunks = SpanPrefetcher(
            span_fetch(source, retrier, pool.gauge), fetcher.offset, total, chunk_bytes,
            options.read_ahead_bytes, pool, retrier.stop,
        )  # fmt: skip
    elif options.read_ahead_bytes > 0 and total - fetcher.offset > chunk_bytes:
        chunks = ReadAhead(chunks, options.read_ahead_bytes, chunk_bytes, retrier.stop)
    return cast(IO[bytes], RemoteStream(chunks, shown, total, start, head))
