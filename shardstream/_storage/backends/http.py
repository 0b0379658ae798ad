"""A small thread-safe HTTP/1.1 client: keep-alive connections per host, bodies read in place.

The HTTP(S) backend's ranged GETs go through this rather than fsspec's aiohttp session: each
request runs in the calling thread (the fetch pool's), keeps its connection for the next one,
and reads its body with ``readinto`` straight into one reused receive buffer
(:mod:`shardstream._storage.remote.buffers`), with no event-loop hop and no per-64 KiB copies.
Redirects are followed (a Hugging Face ``resolve/`` URL answers with one to its CDN), and an
``Authorization`` header is never sent to another host than the one it was given for.

HTTP(S) servers (read-only): ranged GETs on keep-alive connections, versions checked.

Datasets are often served over plain HTTP(S): a Hugging Face ``resolve/main/...`` URL, a web
server, a CDN in front of a bucket. :class:`HttpBackend` reads them as S3 is read: ranged GETs
(:class:`HttpSource`, on the pooled client of this module), several in flight as the
measured first-byte latency asks, announced ranges fetched ahead, retries that resume at the
byte reached. The first answer's ``ETag`` (or ``Last-Modified``) is the object's version: later
GETs carry ``If-Range`` on it, and an answer of another version (a whole new body where a
range was asked) fails with "changed while it was being read", so a rewritten object is never
mixed with the old one. A server that ignores ``Range`` still works (its whole answers are read
from the wanted byte on), slowly, with one warning. Listing and existence go through fsspec's
HTTP filesystem. Writing is a clear error.

Storage options: ``headers`` (a dict sent with every request, e.g. ``{"Authorization":
"Bearer ..."}``), as fsspec's HTTP filesystem takes them."""

from __future__ import annotations

import contextlib
import http.client
import logging
import ssl
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

from shardstream._storage.backends.generic import Backend
from shardstream._storage.background import ProcessLocal
from shardstream._storage.options import ReadOptions
from shardstream._storage.remote.buffers import read_body
from shardstream._storage.remote.retry import StatusError

__all__ = [
    "ConnectionPool",
    "HttpBackend",
    "HttpBody",
    "HttpClient",
    "HttpSource",
    "connection_pool",
]


#: Idle connections kept per host (each fetch-pool thread holds one while it reads).
_MAX_IDLE = 96
_MAX_REDIRECTS = 8
_REDIRECTS = frozenset({301, 302, 303, 307, 308})

_Origin = tuple[str, str, int]


class ConnectionPool:
    """Idle keep-alive connections per ``(scheme, host, port)``, taken and given back by threads.

    Args:
        timeout_s: Connect and read timeout of every connection (a stalled read fails).
    """

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._idle: dict[_Origin, list[http.client.HTTPConnection]] = {}
        self._lock = threading.Lock()
        self._context: ssl.SSLContext | None = None

    def _connect(self, origin: _Origin) -> http.client.HTTPConnection:
        scheme, host, port = origin
        if scheme == "https":
            if self._context is None:
                self._context = ssl.create_default_context()
            return http.client.HTTPSConnection(
                host, port, timeout=self.timeout_s, context=self._context
            )
        return http.client.HTTPConnection(host, port, timeout=self.timeout_s)

    def request(
        self, method: str, url: str, headers: Mapping[str, str]
    ) -> tuple[http.client.HTTPResponse, str]:
        """Send ``method url`` (following redirects); ``(response, final URL)``.

        The response's connection goes back to the pool when its body has been read whole
        (:class:`HttpBody` does that); an error status is raised as :class:`StatusError`
        after its body is drained.
        """
        sent = dict(headers)
        for _ in range(_MAX_REDIRECTS):
            response, origin = self._send(method, url, sent)
            if response.status not in _REDIRECTS:
                if response.status >= 400:
                    self.finish(response, origin, drain=True)
                    raise StatusError(response.status, "", response.reason or "")
                response._shardstream_origin = origin  # type: ignore[attr-defined]
                return response, url
            target = urllib.parse.urljoin(url, response.getheader("Location") or "")
            self.finish(response, origin, drain=True)
            if urllib.parse.urlsplit(target).netloc != urllib.parse.urlsplit(url).netloc:
                sent = {k: v for k, v in sent.items() if k.lower() != "authorization"}
            url = target
        raise StatusError(310, "TooManyRedirects", f"more than {_MAX_REDIRECTS} redirects")

    def _send(
        self, method: str, url: str, headers: Mapping[str, str]
    ) -> tuple[http.client.HTTPResponse, _Origin]:
        parts = urllib.parse.urlsplit(url)
        scheme = parts.scheme.lower()
        origin = (scheme, parts.hostname or "", parts.port or (443 if scheme == "https" else 80))
        target = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
        with self._lock:
            idle = self._idle.get(origin)
            connection = idle.pop() if idle else None
        for fresh in (False, True) if connection is not None else (True,):
            if fresh or connection is None:
                connection = self._connect(origin)
            try:
                connection.request(method, target, headers=dict(headers))
                response = connection.getresponse()
                response._shardstream_connection = connection  # type: ignore[attr-defined]
                return response, origin
            except (ConnectionError, http.client.RemoteDisconnected, http.client.BadStatusLine):
                connection.close()
                if fresh:  # a new connection failed: the retrier decides
                    raise
                # an idle connection the server had closed meanwhile: try a new one at once
        raise AssertionError("unreachable")  # pragma: no cover

    def finish(self, response: http.client.HTTPResponse, origin: _Origin, drain: bool) -> None:
        """Give a response's connection back when its body was read whole; else close it."""
        connection = getattr(response, "_shardstream_connection", None)
        if drain and not response.isclosed():
            with contextlib.suppress(OSError, http.client.HTTPException):
                response.read(64 * 2**10)
        reusable = response.isclosed() and not response.will_close
        response.close()
        if connection is None:
            return
        if not reusable:
            connection.close()
            return
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if len(idle) < _MAX_IDLE:
                idle.append(connection)
                return
        connection.close()


_pools: ProcessLocal[dict[float, ConnectionPool]] = ProcessLocal(dict)


def connection_pool(timeout_s: float) -> ConnectionPool:
    """This process's pool for ``timeout_s`` (a forked child gets its own)."""
    pools = _pools.get()
    pool = pools.get(timeout_s)
    if pool is None:
        pool = pools[timeout_s] = ConnectionPool(timeout_s)
    return pool


class HttpBody:
    """The body of one ranged GET, read into buffers of the requested size without joins.

    Like :class:`~shardstream._storage.backends.s3client.SyncS3Body`: bytes received before a
    failure are returned and the failure raised by the next call, so a retry resumes after
    them; a body read whole gives its connection back for the next request.
    """

    def __init__(self, pool: ConnectionPool, response: http.client.HTTPResponse) -> None:
        self._pool, self._response = pool, response
        self._origin: _Origin = getattr(response, "_shardstream_origin", ("", "", 0))
        self._error: BaseException | None = None

    def read_extent(self, num_bytes: int) -> Any:
        """Up to ``num_bytes`` of the body (a view of a reused buffer for large reads)."""
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        data, failure = read_body(self._response.readinto, num_bytes)
        if failure is not None:
            if not data:
                raise failure
            self._error = failure  # raised by the next call, after these bytes
        return data

    def close(self) -> None:
        """Give a fully read connection back to the pool; drop a half-read or broken one."""
        if self._error is not None:
            connection = getattr(self._response, "_shardstream_connection", None)
            if connection is not None:
                connection.close()
        self._pool.finish(self._response, self._origin, drain=False)


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

    def _send(self, method: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        """Send one request of this object (a store may sign it first)."""
        response, _ = self.client.pool.request(method, self._url(), headers)
        return response

    def stat(self) -> tuple[int, str | None]:
        """The object's size and version (a HEAD request)."""
        response = self._send("HEAD", self._headers())
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
            response = self._send("GET", headers)
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
