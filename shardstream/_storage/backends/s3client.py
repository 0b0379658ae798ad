"""Ranged S3 GETs on a plain (synchronous) botocore client, read into one buffer per request.

s3fs talks to S3 through aiobotocore from an event loop in another thread, and copies and joins
each body's 64 KiB parts; botocore's own client reads each body straight into one buffer, at
about half the CPU per byte (README, *Benchmarks*), and is thread-safe, so several GETs run at
once from a small thread pool (:mod:`shardstream._storage.remote.prefetch`).

The client is built from the same settings as the s3fs filesystem (keys, token, endpoint,
``client_kwargs``, ``config_kwargs``, session ``kwargs`` such as ``profile``), once per process
and filesystem. Filesystems this module cannot mirror exactly (a caller-supplied session, extra
request arguments such as SSE-C keys) return ``None`` from :func:`sync_client`, and callers keep
using aiobotocore for them.

S3 uploads on a plain botocore client, with parts in flight while the next one is written.

s3fs uploads a multipart part inside ``write()``, through aiobotocore, so the process packing a
shard waits for every part, at several times the CPU per byte of a plain ``put_object``
(README, *Benchmarks*). :class:`S3Upload` sends the same requests (``CreateMultipartUpload``,
``UploadPart``, ``CompleteMultipartUpload``, or one ``PutObject`` when the object fits in a
part) on the synchronous client of :mod:`shardstream._storage.backends.s3client`, from a small
thread pool, so the caller keeps writing while up to ``max_in_flight`` parts upload.

Guarantees are those of ``Store.open_atomic_write``: the object becomes
visible only when the upload completes; :meth:`S3Upload.discard` aborts it; memory is bounded
by ``(max_in_flight + 1)`` parts whatever the object's size. Every request is retried like a
read (:class:`~shardstream._storage.remote.retry.Retrier`: transient errors with backoff, fatal
ones at once with the URL named); parts are idempotent (a retried part replaces itself)."""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shardstream._storage.background import ProcessLocal, ProcessLock
from shardstream._storage.options import ReadOptions
from shardstream._storage.remote.buffers import read_body
from shardstream._storage.remote.retry import Retrier, client_error_code

__all__ = [
    "PresignedGets",
    "S3Upload",
    "SyncS3Body",
    "open_s3_upload",
    "put_if_absent",
    "sync_client",
]


#: This process's clients (connection pools), by (filesystem, timeout, connections).
_clients: ProcessLocal[dict[tuple[int, float, int], Any]] = ProcessLocal(dict)
#: botocore sessions, kept across fork: a session caches the parsed service model (~1 MB of
#: JSON), so a DataLoader worker forked after the parent made a client starts its own in ~15 ms
#: instead of ~80 ms (much more on a busy machine). Clients (connection pools) stay per process.
_sessions: dict[str, Any] = {}
_lock = ProcessLock()  # a fork while a thread makes a client leaves the child's unlocked


def _can_mirror(fs: Any) -> bool:
    """True when a botocore client made here sends the same requests as ``fs`` would."""
    owned = getattr(fs, "_session_is_owned", True) or getattr(fs, "session", None) is None
    extra = getattr(fs, "s3_additional_kwargs", None)
    return bool(owned) and not extra and hasattr(fs, "client_kwargs")


def _client_arguments(fs: Any, timeout_s: float, max_connections: int) -> dict[str, Any]:
    """``create_client`` arguments equivalent to ``fs.set_session()``'s, retries turned off."""
    from botocore.config import Config

    client_kwargs = dict(fs.client_kwargs)
    init = {
        "aws_access_key_id": fs.key,
        "aws_secret_access_key": fs.secret,
        "aws_session_token": fs.token,
        "endpoint_url": fs.endpoint_url,
    }
    init = {k: v for k, v in init.items() if v is not None and v != client_kwargs.get(k)}
    if "use_ssl" not in client_kwargs:
        init["use_ssl"] = fs.use_ssl
    config = dict(fs.config_kwargs)
    config.setdefault("connect_timeout", timeout_s)
    config.setdefault("read_timeout", timeout_s)
    config["retries"] = {"total_max_attempts": 1}  # the Retrier owns retries
    # What botocore signs S3 requests with anyway; said outright so presigned URLs use it too
    # (they would default to SigV2, which newer regions refuse).
    config.setdefault("signature_version", "s3v4")
    config["max_pool_connections"] = max(
        max_connections, int(config.get("max_pool_connections") or 0)
    )
    if fs.anon:
        from botocore import UNSIGNED

        secret_names = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
        for name in secret_names:
            init.pop(name, None)
            client_kwargs.pop(name, None)
        config["signature_version"] = UNSIGNED
    return {"config": Config(**config), **init, **client_kwargs}


def sync_client(fs: Any, timeout_s: float, max_connections: int) -> Any:
    """A botocore S3 client equivalent to s3fs filesystem ``fs`` (one per process), or None.

    Args:
        fs: An ``s3fs.S3FileSystem``.
        timeout_s: Connect and read timeout (a read making no progress this long fails).
        max_connections: Connections kept for reuse: at least the GETs run at once.
    """
    if not _can_mirror(fs):
        return None
    key = (id(fs), timeout_s, max_connections)
    clients = _clients.get()
    with _lock:
        client = clients.get(key)
        if client is None:
            session = _session(dict(getattr(fs, "kwargs", {}) or {}))
            arguments = _client_arguments(fs, timeout_s, max_connections)
            client = session.create_client("s3", **arguments)
            client._shardstream_fs = fs  # keeps id(fs) from being reused while cached
            clients[key] = client
    return client


def _session(kwargs: dict[str, Any]) -> Any:
    """The botocore session for these ``Session`` arguments (made once, reused after fork)."""
    import botocore.session

    key = repr(sorted(kwargs.items()))
    session = _sessions.get(key)
    if session is None:
        session = _sessions[key] = botocore.session.Session(**kwargs)
    return session


class SyncS3Body:
    """The body of one ranged GET, read into buffers of the requested size without joins.

    ``read_extent(n)`` returns a ``bytearray`` of up to ``n`` bytes filled by ``readinto`` on the
    HTTP response (no intermediate copies). Bytes received before a failure are returned, and
    the failure is raised by the next call, so a retry resumes after them.
    """

    def __init__(self, body: Any) -> None:
        self._body = body
        raw = getattr(body, "_raw_stream", body)  # a StreamingBody, or urllib3's response
        self._raw = raw
        self._fp = getattr(raw, "_fp", None)  # http.client.HTTPResponse under urllib3
        self._error: BaseException | None = None
        self._finished = False

    def read_extent(self, num_bytes: int) -> bytearray | memoryview:
        """Up to ``num_bytes`` of the body; an empty buffer at its end.

        Reads of :data:`~shardstream._storage.remote.buffers.MIN_POOLED_BYTES` or more land in a
        reused buffer and come back as a view of it (give it back with
        :func:`~shardstream._storage.remote.buffers.recycle`); smaller ones as a ``bytearray``.
        """
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        if self._fp is None or not hasattr(self._fp, "readinto"):
            return bytearray(self._body.read(num_bytes))  # pragma: no cover - other transports
        data, failure = read_body(self._fp.readinto, num_bytes)
        if failure is not None:
            if self._raw is not None:
                self._raw.close()  # a broken connection is never reused, nor left for the GC
            if not data:
                raise failure
            self._error = failure  # raised by the next call, after these bytes
        return data

    def close(self) -> None:
        """Give a fully read connection back to the pool; drop a half-read one."""
        raw = self._raw
        if raw is None:
            self._body.close()
        elif self._error is None and self._fp is not None and self._fp.isclosed():
            raw.release_conn()  # read to its end: the connection is reused (keep-alive)
        else:
            raw.close()  # half read or broken: closing drops the connection too


#: A presigned URL is asked for this long and reused for at most ``_URL_REUSE_S`` of it (a GET
#: started late in its life still has time to finish); ``_MAX_URLS`` per process, newest kept.
_URL_EXPIRES_S = 3600
_URL_REUSE_S = 900
_MAX_URLS = 4096


class PresignedGets:
    """Ranged GETs sent on ``client``'s own HTTP session to a presigned URL per object.

    botocore spends ~1.3 ms of CPU per request on events, endpoint rules, signing and
    parsing (measured on radosgw: a 1-byte GET costs 1.6 ms of CPU through ``get_object``,
    0.4 ms as a presigned request), which is a fifth of a DataLoader worker's CPU when it
    streams 4-8 MB pieces. Signing once per object and sending plain requests through the same
    connection pool (same proxies, TLS settings and timeouts) keeps only the transfer.

    Errors look like ``get_object``'s: HTTP errors become ``botocore`` ``ClientError`` s with
    the S3 error code, transport errors keep their botocore types, and URLs in messages lose
    their query string (the signature). A 403 is retried once through ``get_object`` with a
    fresh URL (credentials may have been refreshed since the URL was signed).
    """

    def __init__(self, client: Any) -> None:
        self.client = client
        self._session = client._endpoint.http_session
        self._urls: dict[tuple[str, str, str | None], tuple[str, float]] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_client(cls, client: Any) -> PresignedGets | None:
        """The instance for ``client`` (one per client), or None if it has no HTTP session."""
        if getattr(getattr(client, "_endpoint", None), "http_session", None) is None:
            return None
        found = getattr(client, "_shardstream_presigned", None)
        if found is None:
            found = client._shardstream_presigned = cls(client)
        return found

    def url(self, bucket: str, key: str, version: str | None) -> str:
        """A presigned GET URL of the object, reused while young enough."""
        import time

        now = time.monotonic()
        with self._lock:
            known = self._urls.get((bucket, key, version))
        if known is not None and now - known[1] < _URL_REUSE_S:
            return known[0]
        params = {"Bucket": bucket, "Key": key, **({"VersionId": version} if version else {})}
        url = self.client.generate_presigned_url("get_object", Params=params,
                                                 ExpiresIn=_URL_EXPIRES_S)  # fmt: skip
        with self._lock:
            if len(self._urls) >= _MAX_URLS:
                self._urls.clear()
            self._urls[(bucket, key, version)] = (url, now)
        return str(url)

    def forget(self, bucket: str, key: str, version: str | None) -> None:
        with self._lock:
            self._urls.pop((bucket, key, version), None)

    def get(
        self, bucket: str, key: str, version: str | None, headers: dict[str, str]
    ) -> tuple[dict[str, Any], Any]:
        """``(fields, raw response)`` of one GET; ``fields`` as ``get_object`` names them."""
        from botocore.awsrequest import AWSRequest

        url = self.url(bucket, key, version)
        request = AWSRequest(method="GET", url=url, headers=headers, stream_output=True)
        try:
            response = self._session.send(request.prepare())
        except Exception as exc:
            raise _without_query(exc) from None
        found = response.headers
        if response.status_code >= 300:
            self._raise_error(response, bucket, key, version)
        fields = {"ContentRange": found.get("content-range"), "ETag": found.get("etag"),
                  "ContentLength": found.get("content-length")}  # fmt: skip
        return fields, response.raw

    def _raise_error(self, response: Any, bucket: str, key: str, version: str | None) -> None:
        import re

        from botocore.exceptions import ClientError

        raw = response.raw
        try:
            text = raw.read(64 * 2**10).decode("utf-8", "replace")
        finally:
            raw.close()  # errors are rare: drop the connection rather than reason about it
        status = response.status_code
        code = re.search(r"<Code>([^<]*)</Code>", text)
        message = re.search(r"<Message>([^<]*)</Message>", text)
        if status == 403:
            self.forget(bucket, key, version)
        error = {"Code": code.group(1) if code else str(status),
                 "Message": message.group(1) if message else ""}  # fmt: skip
        meta = {"HTTPStatusCode": status}
        raise ClientError({"Error": error, "ResponseMetadata": meta}, "GetObject")


def _without_query(exc: BaseException) -> BaseException:
    """``exc`` with any URL in its botocore fields cut before ``?`` (no signature shown)."""
    fields = getattr(exc, "kwargs", None)
    if not isinstance(fields, dict):
        return exc
    url = fields.get("endpoint_url")
    if not isinstance(url, str) or "?" not in url:
        return exc
    try:
        return type(exc)(**{**fields, "endpoint_url": url.split("?", 1)[0]})
    except Exception:  # pragma: no cover - an exception type that cannot be rebuilt
        return exc


#: Parts uploading at once per open object (each holds one part in memory).
DEFAULT_IN_FLIGHT = 2


class S3Upload:
    """A write-only binary file that becomes the S3 object ``bucket/key`` on :meth:`close`.

    Args:
        client: A botocore S3 client (:func:`~shardstream._storage.backends.s3client.sync_client`).
        bucket: The bucket.
        key: The object's key.
        shown: The URL as shown in messages (no secrets).
        part_size: Bytes per part (S3 needs at least 5 MiB for all but the last).
        options: Retry settings (``max_attempts``, ``backoff_s``, ``max_backoff_s``).
        secrets: Strings to scrub from messages.
        max_in_flight: Parts uploading at once; a ``write`` that fills one more part waits.
    """

    def __init__(
        self,
        client: Any,
        bucket: str,
        key: str,
        shown: str,
        part_size: int,
        options: ReadOptions,
        secrets: Sequence[str] = (),
        max_in_flight: int = DEFAULT_IN_FLIGHT,
    ) -> None:
        self.client, self.bucket, self.key, self.shown = client, bucket, key, shown
        self.part_size = max(1, part_size)
        self.options, self.secrets = options, secrets
        self.max_in_flight = max(1, max_in_flight)
        self.closed = False
        self._buffer = bytearray()
        self._position = 0
        self._upload_id: str | None = None
        self._parts: collections.deque[Future[dict[str, Any]]] = collections.deque()
        self._done: list[dict[str, Any]] = []
        self._pool: ThreadPoolExecutor | None = None
        self._stop = threading.Event()

    # -- the file interface --------------------------------------------------------------------

    def write(self, data: Any) -> int:
        """Add ``data``; each filled part starts uploading (waiting while too many are)."""
        self._check_open()
        with memoryview(data) as whole, whole.cast("B") as view:
            count = view.nbytes
            while view.nbytes:
                room = self.part_size - len(self._buffer)
                self._buffer += view[:room]
                self._position += min(room, view.nbytes)
                view = view[room:]
                if len(self._buffer) >= self.part_size:
                    self._send_part()
        return count

    def tell(self) -> int:
        """Bytes written so far."""
        return self._position

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return False

    def seekable(self) -> bool:
        return False

    def flush(self) -> None:
        """Wait until the parts started so far are uploaded (a partial part stays buffered)."""
        self._check_open()
        while self._parts:
            self._collect()

    def close(self) -> None:
        """Finish the upload: the object becomes visible now (or an error is raised)."""
        if self.closed:
            return
        try:
            if self._upload_id is None:
                body = self._take_buffer()
                self._retried("uploading", 0, lambda: self._request("put_object", Body=body))
            else:
                if self._buffer:
                    self._send_part()
                while self._parts:
                    self._collect()
                self._complete()
        except BaseException:
            self.discard()
            raise
        self.closed = True
        self._shutdown()

    def discard(self) -> None:
        """Abort: nothing becomes visible, uploaded parts are freed (best effort)."""
        if self.closed:
            return
        self.closed = True
        self._stop.set()
        for future in self._parts:
            future.cancel()
        self._shutdown()
        self._buffer = bytearray()
        if self._upload_id is not None:
            upload_id, self._upload_id = self._upload_id, None
            self._retried("aborting the upload", 0, lambda: self._request(
                "abort_multipart_upload", UploadId=upload_id), stoppable=False)  # fmt: skip

    # -- parts ---------------------------------------------------------------------------------

    def _send_part(self) -> None:
        if self._upload_id is None:
            answer = self._retried("starting the upload", 0, lambda: self._request(
                "create_multipart_upload"))  # fmt: skip
            self._upload_id = answer["UploadId"]
        while len(self._parts) >= self.max_in_flight:
            self._collect()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.max_in_flight, "shardstream-upload")
        number = len(self._done) + len(self._parts) + 1
        offset = self._position - len(self._buffer)
        body = self._take_buffer()
        self._parts.append(self._pool.submit(self._upload_part, number, offset, body))

    def _upload_part(self, number: int, offset: int, body: bytearray) -> dict[str, Any]:
        answer = self._retried(f"uploading part {number}", offset, lambda: self._request(
            "upload_part", UploadId=self._upload_id, PartNumber=number, Body=body))  # fmt: skip
        return {"PartNumber": number, "ETag": answer["ETag"]}

    def _collect(self) -> None:
        """Wait for the oldest part in flight; its error (if any) is raised here."""
        self._done.append(self._parts.popleft().result())

    def _complete(self) -> None:
        parts, upload_id = self._done, self._upload_id

        def complete() -> Any:
            try:
                return self._request(
                    "complete_multipart_upload", UploadId=upload_id,
                    MultipartUpload={"Parts": parts},
                )  # fmt: skip
            except Exception as exc:
                # An earlier try completed it and only its answer was lost: accept that.
                if client_error_code(exc)[0] != "NoSuchUpload" or not self._exists(len(parts)):
                    raise
                return {}

        self._retried("completing the upload", self._position, complete)
        self._upload_id = None

    def _exists(self, num_parts: int) -> bool:
        """True when the object is there as a multipart object of ``num_parts`` parts."""
        try:
            head = self._request("head_object")
        except Exception:
            return False
        return str(head.get("ETag", "")).strip('"').endswith(f"-{num_parts}")

    # -- plumbing ------------------------------------------------------------------------------

    def _take_buffer(self) -> bytearray:
        body, self._buffer = self._buffer, bytearray()
        return body

    def _request(self, method: str, **kwargs: Any) -> Any:
        return getattr(self.client, method)(Bucket=self.bucket, Key=self.key, **kwargs)

    def _retried(
        self, action: str, offset: int, call: Callable[[], Any], stoppable: bool = True
    ) -> Any:
        """``call()``, retried on transient errors; ``offset`` is the first byte it sends.

        A stoppable request gives up at once after :meth:`discard` (its error is raised).
        """
        stop = self._stop if stoppable else None
        retrier = Retrier.for_options(self.shown, action, self.options, self.secrets, stop)
        while True:
            try:
                return call()
            except Exception as exc:
                retrier.failed(exc, offset)
                if stoppable and self._stop.is_set():
                    raise

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"{self.shown}: write to a closed upload")

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


def open_s3_upload(
    fs: Any, path: str, shown: str, part_size: int, options: ReadOptions, secrets: Sequence[str]
) -> S3Upload | None:
    """An :class:`S3Upload` of ``path`` on ``fs`` (an s3fs filesystem), or ``None`` where the
    plain client cannot send what ``fs`` would (then s3fs's own file is used)."""

    client = sync_client(fs, options.timeout_s, 2 * DEFAULT_IN_FLIGHT + 8)
    if client is None:
        return None
    bucket, key, _ = fs.split_path(path)
    return S3Upload(client, bucket, key, shown, part_size, options, secrets)


#: Answers of a server that refused a conditional ``PutObject`` because the key exists (412), or
#: because another conditional write of the key was under way (409).
_EXISTS_CODES = frozenset({"PreconditionFailed", "ConditionalRequestConflict"})


def put_if_absent(fs: Any, path: str, data: bytes, options: ReadOptions) -> bool | None:
    """``PutObject`` with ``If-None-Match: *``: True if created, False if the key exists.

    None where it cannot be asked this way (no plain client for ``fs``) or the server does not
    support conditional writes (``NotImplemented``): the caller then checks and writes itself.
    """

    client = sync_client(fs, options.timeout_s, 2 * DEFAULT_IN_FLIGHT + 8)
    if client is None:
        return None
    bucket, key, _ = fs.split_path(path)
    try:
        client.put_object(Bucket=bucket, Key=key, Body=data, IfNoneMatch="*")
    except Exception as error:
        code, status = client_error_code(error)
        if code in _EXISTS_CODES or status in (409, 412):
            return False
        if code == "NotImplemented" or status == 501:
            return None
        raise
    return True
