"""Reading remote objects: few, long ranged GETs per shard on S3, chunked ranges elsewhere.

:func:`open_remote` is what :meth:`Store.open_read` uses for every non-local URL. With a cache it
asks for the object's size and ETag (HEAD), downloads a missing object into the cache and opens
the local file. Otherwise it streams the wanted byte range through a
:class:`~shardstream.storage.ranged.ChunkFetcher` (retries, resume at the byte offset reached) and
prefetches in a background thread, never past the end of the range. On S3 that stream makes no
HEAD: the first ranged GET's ``Content-Range`` and ``ETag`` give the size and version, and later
GETs carry ``If-Match`` on that ETag so a rewritten object is never mixed with the old one.

On S3 this module calls aiobotocore directly (through s3fs's session, so credentials and
endpoints come from the usual places) and turns botocore's own retries off: the retry loop
here is the only one, which keeps the total budget equal to ``ReadOptions.max_attempts``.
Nothing here is created before it is first used in a process, so DataLoader workers that fork
after the dataset was built get sessions and threads of their own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from typing import IO, Any, cast

import fsspec
from fsspec.asyn import sync

from shardstream.storage.cache import ShardCache
from shardstream.storage.options import ReadOptions
from shardstream.storage.ranged import BoundedFile, ChunkFetcher, ChunkSource, RemoteStream
from shardstream.storage.readahead import ReadAhead
from shardstream.storage.retry import Retrier, client_error_code

__all__ = ["open_remote", "read_filesystem"]

_S3_PROTOCOLS = frozenset({"s3", "s3a"})
_MIN_CHUNK_BYTES = 256 * 2**10
_MAX_CHUNK_BYTES = 8 * 2**20
#: First ranged GET after a seek; later ones double up to the chunk size.
_FIRST_SPAN_BYTES = 2**20
#: First ranged GET after an open: readers often peek at byte 0 and then seek to a piece.
_OPEN_SPAN_BYTES = 64 * 2**10


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


async def _read_up_to(
    body: Any, num_bytes: int, timeout_s: float
) -> tuple[bytes, BaseException | None]:
    """Up to ``num_bytes`` from an aiobotocore body, and the error that ended it early if any.

    Bytes received before a failure are returned too (the caller resumes after them), and a
    read that receives nothing for ``timeout_s`` fails with ``TimeoutError`` (a stall).
    """
    parts: list[bytes] = []
    received = 0
    try:
        if hasattr(asyncio, "timeout"):  # Python 3.11+: one cheap watchdog, moved on progress
            loop = asyncio.get_running_loop()
            async with asyncio.timeout(timeout_s) as watchdog:
                while received < num_bytes:
                    piece = await body.read(num_bytes - received)
                    if not piece:
                        break
                    parts.append(piece)
                    received += len(piece)
                    watchdog.reschedule(loop.time() + timeout_s)
        else:  # pragma: no cover - Python 3.10
            while received < num_bytes:
                piece = await asyncio.wait_for(body.read(num_bytes - received), timeout_s)
                if not piece:
                    break
                parts.append(piece)
                received += len(piece)
    except Exception as exc:  # classified by the caller's Retrier
        return b"".join(parts), exc
    return b"".join(parts), None


class _S3Body:
    def __init__(self, fs: Any, body: Any, timeout_s: float) -> None:
        self._fs, self._body, self._timeout_s = fs, body, timeout_s
        self._error: BaseException | None = None

    def read_chunk(self, num_bytes: int) -> bytes:
        if self._error is not None:
            raise self._error
        data, self._error = sync(self._fs.loop, _read_up_to, self._body, num_bytes, self._timeout_s)
        if not data and self._error is not None:
            raise self._error
        return data  # any error is raised by the next call, after these bytes are counted

    def close(self) -> None:
        sync(self._fs.loop, self._body.aclose)


class _S3Source:
    """HEAD and ranged GETs of one S3 object, straight through aiobotocore."""

    def __init__(self, fs: Any, path: str, timeout_s: float) -> None:
        self.fs, self.timeout_s = fs, timeout_s
        self.bucket, self.key, version = fs.split_path(path)
        self._version = {"VersionId": version} if version else {}
        self.etag: str | None = None
        self.total_size: int | None = None

    async def _call(self, method: str, **kwargs: Any) -> Any:
        await self.fs.set_session()
        client = await self.fs.get_s3(self.bucket)
        call = getattr(client, method)(Bucket=self.bucket, Key=self.key, **self._version, **kwargs)
        return await asyncio.wait_for(call, self.timeout_s)

    def stat(self) -> tuple[int, str | None]:
        head = sync(self.fs.loop, self._call, "head_object")
        self.etag = head.get("ETag")
        self.total_size = int(head["ContentLength"])
        return self.total_size, self.etag

    def open_body(self, offset: int, end: int) -> _S3Body | _EmptyBody:
        # If-Match: a resumed read must never splice two versions of a rewritten object.
        match = {"IfMatch": self.etag} if self.etag else {}
        try:
            response = sync(
                self.fs.loop, self._call, "get_object", Range=f"bytes={offset}-{end - 1}", **match
            )
        except Exception as exc:
            if client_error_code(exc)[0] != "InvalidRange":
                raise
            self.stat()  # the range starts at or past the object's end: learn its real size
            return _EmptyBody()
        self.etag = self.etag or response.get("ETag")
        self.total_size = _total_size(response, offset)
        return _S3Body(self.fs, response["Body"], self.timeout_s)


def _total_size(response: Mapping[str, Any], offset: int) -> int:
    """The object's size from a ranged GET (``Content-Range: bytes a-b/total``)."""
    content_range = str(response.get("ContentRange") or "")
    total = content_range.rpartition("/")[2]
    if total.isdigit():
        return int(total)
    return offset + int(response["ContentLength"])  # the server sent the rest whole


class _EmptyBody:
    def read_chunk(self, num_bytes: int) -> bytes:
        return b""

    def close(self) -> None:
        """Nothing to release."""


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
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    is_s3 = bool(protocols & _S3_PROTOCOLS)
    source = _S3Source(fs, path, options.timeout_s) if is_s3 else _GenericSource(fs, path)
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
    # A known range is asked for whole (up to a chunk); an open-ended read starts small,
    # since readers often peek at the start and then seek.
    opening = _OPEN_SPAN_BYTES if end is None else max(1, end - start)
    fetcher.next_span_bytes = min(opening, chunk_bytes)
    head = b""
    if isinstance(source, _S3Source):
        head = fetcher.next_chunk() or b""  # learns the size (and ETag) without a HEAD
    total = fetcher.size if fetcher.size is not None else start
    chunks: ChunkSource = fetcher
    if options.read_ahead_bytes > 0 and total - fetcher.offset > chunk_bytes:
        chunks = ReadAhead(chunks, options.read_ahead_bytes, chunk_bytes, retrier.stop)
    return cast(IO[bytes], RemoteStream(chunks, shown, total, start, head))
