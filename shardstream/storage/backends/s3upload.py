"""S3 uploads on a plain botocore client, with parts in flight while the next one is written.

s3fs uploads a multipart part inside ``write()``, through aiobotocore, so the process packing a
shard waits for every part, at several times the CPU per byte of a plain ``put_object``
(README, *Benchmarks*). :class:`S3Upload` sends the same requests (``CreateMultipartUpload``,
``UploadPart``, ``CompleteMultipartUpload``, or one ``PutObject`` when the object fits in a
part) on the synchronous client of :mod:`shardstream.storage.backends.s3client`, from a small
thread pool, so the caller keeps writing while up to ``max_in_flight`` parts upload.

Guarantees are those of ``Store.open_atomic_write``: the object becomes
visible only when the upload completes; :meth:`S3Upload.discard` aborts it; memory is bounded
by ``(max_in_flight + 1)`` parts whatever the object's size. Every request is retried like a
read (:class:`~shardstream.storage.remote.retry.Retrier`: transient errors with backoff, fatal
ones at once with the URL named); parts are idempotent (a retried part replaces itself).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from shardstream.storage.options import ReadOptions
from shardstream.storage.remote.retry import Retrier, client_error_code

__all__ = ["S3Upload", "open_s3_upload", "put_if_absent"]

#: Parts uploading at once per open object (each holds one part in memory).
DEFAULT_IN_FLIGHT = 2


class S3Upload:
    """A write-only binary file that becomes the S3 object ``bucket/key`` on :meth:`close`.

    Args:
        client: A botocore S3 client (:func:`~shardstream.storage.backends.s3client.sync_client`).
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
    from shardstream.storage.backends.s3client import sync_client

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
    from shardstream.storage.backends.s3client import sync_client

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
