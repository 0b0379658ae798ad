"""HTTP(S) servers (read-only): ranged GETs on keep-alive connections, versions checked.

Datasets are often served over plain HTTP(S): a Hugging Face ``resolve/main/...`` URL, a web
server, a CDN in front of a bucket. :class:`HttpBackend` reads them as S3 is read: ranged GETs
(:class:`HttpSource`, on the pooled client of :mod:`.httpclient`), several in flight as the
measured first-byte latency asks, announced ranges fetched ahead, retries that resume at the
byte reached. The first answer's ``ETag`` (or ``Last-Modified``) is the object's version: later
GETs carry ``If-Range`` on it, and an answer of another version (a whole new body where a
range was asked) fails with "changed while it was being read", so a rewritten object is never
mixed with the old one. A server that ignores ``Range`` still works (its whole answers are read
from the wanted byte on), slowly, with one warning. Listing and existence go through fsspec's
HTTP filesystem. Writing is a clear error.

Storage options: ``headers`` (a dict sent with every request, e.g. ``{"Authorization":
"Bearer ..."}``), as fsspec's HTTP filesystem takes them.
"""

from __future__ import annotations

import http.client
import logging
from collections.abc import Mapping
from typing import Any

from shardstream.storage.backends.generic import Backend
from shardstream.storage.backends.httpclient import ConnectionPool, HttpBody, connection_pool
from shardstream.storage.options import ReadOptions
from shardstream.storage.remote.retry import StatusError

__all__ = ["HttpBackend", "HttpClient", "HttpSource"]

logger = logging.getLogger("shardstream.storage")


class HttpBackend(Backend):
    """``http://`` and ``https://`` URLs (read-only)."""

    name = "http"
    writable = False
    pooled_reads = True
    sizes_from_gets = True

    def read_filesystem(
        self, url: str, storage_options: Mapping[str, Any], timeout_s: float
    ) -> tuple[Any, str]:
        """``(client, url)``: the URL is the object's path."""
        return HttpClient(connection_pool(timeout_s), _headers(storage_options)), url

    def range_source(self, fs: Any, path: str, options: ReadOptions) -> HttpSource:
        return HttpSource(fs, path)


def _headers(storage_options: Mapping[str, Any]) -> dict[str, str]:
    found = dict(storage_options.get("headers") or {})
    client_kwargs = storage_options.get("client_kwargs") or {}
    found.update(client_kwargs.get("headers") or {})
    return {str(k): str(v) for k, v in found.items()}


class HttpClient:
    """The pooled connections and the headers every request of a store carries."""

    def __init__(self, pool: ConnectionPool, headers: Mapping[str, str]) -> None:
        self.pool, self.headers = pool, dict(headers)


class HttpSource:
    """HEAD and ranged GETs of one HTTP(S) object.

    Attributes:
        version: The object's ``ETag`` (else ``Last-Modified``) once known; later GETs carry
            ``If-Range`` on it and every answer must carry it.
        total_size: The object's size once known.
    """

    def __init__(self, client: HttpClient, url: str) -> None:
        self.client, self.url = client, url
        self.version: str | None = None
        self.total_size: int | None = None

    def _url(self) -> str:
        """The URL each GET asks (a store may pin the version it found in it)."""
        return self.url

    def _headers(self) -> dict[str, str]:
        """The headers each request carries (a store may add fresh credentials)."""
        return dict(self.client.headers)

    def _conditions(self, headers: dict[str, str]) -> None:
        """Make a GET conditional on the version found first (``If-Range`` here)."""
        if self.version is not None and not self.version.startswith("W/"):
            headers["If-Range"] = self.version  # (a weak ETag never matches If-Range)

    def stat(self) -> tuple[int, str | None]:
        """The object's size and version (a HEAD request)."""
        response, _ = self.client.pool.request("HEAD", self._url(), self._headers())
        try:
            self._check_version(response)
            length = response.getheader("Content-Length")
            if length is None or not length.isdigit():
                raise StatusError(
                    response.status, "NoLength", "the server does not say the object's size"
                )
            self.total_size = int(length)
        finally:
            self.client.pool.finish(response, _origin(response), drain=True)
        return self.total_size, self.version

    def open_body(self, offset: int, end: int) -> HttpBody | _EmptyBody:
        """Start a GET of bytes ``[offset, end)``; learn the size and version from its answer."""
        headers = {**self._headers(), "Range": f"bytes={offset}-{end - 1}"}
        self._conditions(headers)
        try:
            response, _ = self.client.pool.request("GET", self._url(), headers)
        except StatusError as error:
            if error.status != 416:
                raise
            self.stat()  # the range starts at or past the object's end: learn its real size
            return _EmptyBody()
        body = HttpBody(self.client.pool, response)
        try:
            self._check_version(response)  # another version (If-Range refused) raises here
            self.total_size = self._total_size(response, offset)
            if response.status == 200 and offset:
                _skip(response, offset)
        except BaseException:
            body.close()
            raise
        return body

    def _total_size(self, response: http.client.HTTPResponse, offset: int) -> int:
        if response.status == 206:
            found = response.getheader("Content-Range") or ""
            first, _, total = found.removeprefix("bytes ").partition("/")
            if not first.split("-")[0].isdigit() or int(first.split("-")[0]) != offset:
                raise StatusError(502, "BadRange", f"asked for byte {offset}, got {found!r}")
            if total.isdigit():
                return int(total)
            return offset + int(response.getheader("Content-Length") or 0)
        length = response.getheader("Content-Length")
        if length is None or not length.isdigit():
            raise StatusError(
                501, "RangeNotSupported",
                "the server ignores Range requests and does not say the object's size; serve "
                "the shards from a server that answers them (nginx, Apache, object stores, CDNs)",
            )  # fmt: skip
        if offset and not _warned:
            _warned.append(True)
            logger.warning(
                "%s: the server ignores Range requests: every read starts at byte 0 (slow); "
                "serve the shards from a server that answers them", self.url,
            )  # fmt: skip
        return int(length)  # the whole object, same version: the server ignores Range

    def _check_version(self, response: http.client.HTTPResponse) -> None:
        """Learn the version from the first answer; refuse an answer of another one."""
        found = response.getheader("ETag") or response.getheader("Last-Modified")
        if found is None:
            return
        if self.version is None:
            self.version = found
        elif found != self.version:
            raise StatusError(
                412, "PreconditionFailed", f"its version was {self.version}, now {found}"
            )


_warned: list[bool] = []


def _skip(response: http.client.HTTPResponse, count: int) -> None:
    """Read and drop the first ``count`` bytes of a whole-object answer."""
    while count > 0:
        dropped = len(response.read(min(count, 1 << 20)))
        if not dropped:
            raise StatusError(502, "ShortBody", f"the body ended {count} bytes before the range")
        count -= dropped


def _origin(response: http.client.HTTPResponse) -> tuple[str, str, int]:
    origin: tuple[str, str, int] = getattr(response, "_shardstream_origin", ("", "", 0))
    return origin


class _EmptyBody:
    """The body of a range that starts at or past the object's end."""

    def read_extent(self, num_bytes: int) -> bytes:
        return b""

    def close(self) -> None:
        """Nothing to release."""
