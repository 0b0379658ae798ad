"""S3 (and S3-compatible servers): ranged GETs and uploads on botocore's synchronous client.

:class:`S3Backend` reads through :class:`S3Source`, which sends its requests on a plain botocore
client (:mod:`.s3client`: thread-safe, bodies read straight into one buffer per GET);
filesystems that client cannot mirror go through s3fs's aiobotocore client and event loop.
Either way botocore's own retries are off (the
:class:`~shardstream._storage.remote.retry.Retrier` owns them) and the first ranged GET's
``Content-Range`` and ``ETag`` give the object's size and version (no HEAD); later GETs carry
``If-Match`` on that ETag. Writes are multipart uploads with parts in flight
(:mod:`.s3client`), and an exclusive create is a ``PutObject`` with ``If-None-Match: *``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import IO, Any, cast

from fsspec.asyn import sync

from shardstream._storage.backends.generic import Backend, discard
from shardstream._storage.backends.s3client import (
    PresignedGets,
    SyncS3Body,
    open_s3_upload,
    put_if_absent,
    sync_client,
)
from shardstream._storage.options import ReadOptions
from shardstream._storage.remote.retry import client_error_code

__all__ = ["S3Backend", "S3Source"]


class S3Backend(Backend):
    """Amazon S3 and servers that speak its API (``s3://``, ``s3a://``)."""

    name = "s3"
    atomic_put = True
    pooled_reads = True
    sizes_from_gets = True
    credentials = (
        "storage options (--storage-option key=KEY --storage-option secret=SECRET, or "
        "storage_options={'key': ..., 'secret': ...}), the environment (AWS_ACCESS_KEY_ID and "
        "AWS_SECRET_ACCESS_KEY), or a profile (--storage-option profile=NAME)"
    )

    def read_filesystem(
        self, url: str, storage_options: Mapping[str, Any], timeout_s: float
    ) -> tuple[Any, str]:
        options = dict(storage_options)
        config = dict(options.get("config_kwargs") or {})
        config.setdefault("retries", {"total_max_attempts": 1})  # the Retrier owns retries
        config.setdefault("read_timeout", timeout_s)
        config.setdefault("connect_timeout", timeout_s)
        options["config_kwargs"] = config
        return self.filesystem(url, options)

    def range_source(self, fs: Any, path: str, options: ReadOptions) -> S3Source:
        connections = options.max_requests + 8  # the pool's, and callers' own GETs
        client = sync_client(fs, options.timeout_s, connections)
        return S3Source(fs, path, options.timeout_s, client)

    @contextlib.contextmanager
    def atomic_write(
        self, fs: Any, path: str, shown: str, part_size_bytes: int, options: ReadOptions,
        secrets: Sequence[str] = (),
    ) -> Iterator[IO[bytes]]:  # fmt: skip
        """A multipart upload of ``part_size_bytes`` parts, two uploading while the next is
        written, each retried per ``options``; visible only when it completes (a killed
        process leaves an invisible unfinished upload, which a bucket lifecycle rule
        ``AbortIncompleteMultipartUpload`` frees)."""
        upload = open_s3_upload(fs, path, shown, part_size_bytes, options, secrets)
        if upload is None:  # a filesystem the plain client cannot mirror: s3fs's own file
            with super().atomic_write(fs, path, shown, part_size_bytes, options) as stream:
                yield stream
            return
        try:
            yield cast(IO[bytes], upload)
        except BaseException:
            discard(upload, shown)
            raise
        upload.close()

    def create_exclusive(
        self, fs: Any, path: str, data: bytes, shown: str, options: ReadOptions
    ) -> bool:
        """A ``PutObject`` with ``If-None-Match: *`` (two writers never both win); a check and
        a write on servers without conditional writes."""
        created = put_if_absent(fs, path, data, options)
        if created is None:
            return super().create_exclusive(fs, path, data, shown, options)
        self.forget_listings(fs, path)
        return created


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

    def read_extent(self, num_bytes: int) -> bytes:
        if self._error is not None:
            raise self._error
        data, self._error = sync(self._fs.loop, _read_up_to, self._body, num_bytes, self._timeout_s)
        if not data and self._error is not None:
            raise self._error
        return data  # any error is raised by the next call, after these bytes are counted

    def close(self) -> None:
        sync(self._fs.loop, self._body.aclose)


class S3Source:
    """HEAD and ranged GETs of one S3 object, each ranged GET answered as a readable body.

    Args:
        fs: The s3fs filesystem (bucket and key parsing; the aiobotocore fallback).
        path: ``bucket/key`` (with ``?versionId=`` if any).
        timeout_s: Per-request timeout (aiobotocore path; the sync client has its own).
        client: A botocore client from :func:`~.s3client.sync_client`, or ``None`` to use
            aiobotocore.

    Attributes:
        etag: The object's ETag once known; later GETs carry ``If-Match`` on it.
        total_size: The object's size once known.
    """

    def __init__(self, fs: Any, path: str, timeout_s: float, client: Any = None) -> None:
        self.fs, self.timeout_s, self.client = fs, timeout_s, client
        self.bucket, self.key, version = fs.split_path(path)
        self._version_id: str | None = version or None
        self._presigned = PresignedGets.for_client(client) if client is not None else None
        self.etag: str | None = None
        self.total_size: int | None = None

    async def _call(self, method: str, **kwargs: Any) -> Any:
        await self.fs.set_session()
        client = await self.fs.get_s3(self.bucket)
        call = getattr(client, method)(**self._names(), **kwargs)
        return await asyncio.wait_for(call, self.timeout_s)

    def _request(self, method: str, **kwargs: Any) -> Any:
        if self.client is not None:
            return getattr(self.client, method)(**self._names(), **kwargs)
        return sync(self.fs.loop, self._call, method, **kwargs)

    def _names(self) -> dict[str, str]:
        names = {"Bucket": self.bucket, "Key": self.key}
        return {**names, "VersionId": self._version_id} if self._version_id else names

    def _if_match(self) -> dict[str, str]:
        # A resumed read must never splice two versions of a rewritten object.
        return {"IfMatch": self.etag} if self.etag else {}

    def _presigned_get(self, presigned: PresignedGets, byte_range: str) -> tuple[Any, Any]:
        """``(fields, body)`` of a GET on the object's presigned URL; a refused URL (expired,
        credentials rotated since it was signed) is answered once by ``get_object``."""
        headers = {"Range": byte_range, **({"If-Match": self.etag} if self.etag else {})}
        try:
            return presigned.get(self.bucket, self.key, self._version_id, headers)
        except Exception as exc:
            if client_error_code(exc)[1] != 403:
                raise
        response = self._request("get_object", Range=byte_range, **self._if_match())
        return response, response["Body"]

    def stat(self) -> tuple[int, str | None]:
        """The object's size and ETag (a HEAD request)."""
        head = self._request("head_object")
        self.etag = head.get("ETag")
        self.total_size = int(head["ContentLength"])
        return self.total_size, self.etag

    def open_body(self, offset: int, end: int) -> SyncS3Body | _S3Body | _EmptyBody:
        """Start a GET of bytes ``[offset, end)``; learn the size and ETag from its answer."""
        byte_range = f"bytes={offset}-{end - 1}"
        try:
            if self._presigned is not None:
                response, body = self._presigned_get(self._presigned, byte_range)
            else:
                response = self._request("get_object", Range=byte_range, **self._if_match())
                body = response["Body"]
        except Exception as exc:
            if client_error_code(exc)[0] != "InvalidRange":
                raise
            self.stat()  # the range starts at or past the object's end: learn its real size
            return _EmptyBody()
        self.etag = self.etag or response.get("ETag")
        self.total_size = _total_size(response, offset)
        if self.client is not None:
            return SyncS3Body(body)
        return _S3Body(self.fs, body, self.timeout_s)


def _total_size(response: Mapping[str, Any], offset: int) -> int:
    """The object's size from a ranged GET (``Content-Range: bytes a-b/total``)."""
    content_range = str(response.get("ContentRange") or "")
    total = content_range.rpartition("/")[2]
    if total.isdigit():
        return int(total)
    return offset + int(response["ContentLength"])  # the server sent the rest whole


class _EmptyBody:
    """The body of a range that starts at or past the object's end."""

    def read_extent(self, num_bytes: int) -> bytes:
        return b""

    def close(self) -> None:
        """Nothing to release."""
