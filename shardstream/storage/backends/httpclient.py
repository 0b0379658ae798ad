"""A small thread-safe HTTP/1.1 client: keep-alive connections per host, bodies read in place.

The HTTP(S) backend's ranged GETs go through this rather than fsspec's aiohttp session: each
request runs in the calling thread (the fetch pool's), keeps its connection for the next one,
and reads its body with ``readinto`` straight into one reused receive buffer
(:mod:`shardstream.storage.remote.buffers`), with no event-loop hop and no per-64 KiB copies.
Redirects are followed (a Hugging Face ``resolve/`` URL answers with one to its CDN), and an
``Authorization`` header is never sent to another host than the one it was given for.
"""

from __future__ import annotations

import contextlib
import http.client
import ssl
import threading
import urllib.parse
from collections.abc import Mapping
from typing import Any

from shardstream.storage.processlocal import ProcessLocal
from shardstream.storage.remote.buffers import read_body
from shardstream.storage.remote.retry import StatusError

__all__ = ["ConnectionPool", "HttpBody", "connection_pool"]

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

    Like :class:`~shardstream.storage.backends.s3client.SyncS3Body`: bytes received before a
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
