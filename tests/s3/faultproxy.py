"""A loopback HTTP proxy that injects storage faults on chosen requests.

It sits between the S3 client and the S3 server (moto) and forwards every request unchanged,
except that a :class:`Rule` matching a request (method, path substring, the Nth match) can:

- ``"reset"``: reset the connection (TCP RST), before the response or after ``after_bytes`` of
  the body;
- ``"503"``: answer ``503 SlowDown`` with S3's XML error body, without asking the server;
- ``"403"``: answer ``403 AccessDenied`` (``Request has expired``) the same way;
- ``"stall"``: stop for ``stall_s`` seconds, before the response or after ``after_bytes``;
- ``"cut"``: send the full ``Content-Length`` header but only ``after_bytes`` of the body, then
  close the connection.

``delay_s`` holds back the first byte of every answer until that long after its request
arrived, as a data center's object store does (10-50 ms); faults then come on top of it.
Counters (``requests``, ``body_bytes_sent``, ``Rule.hits``, ``max_in_flight``) let tests assert
that a fault was really hit. Every loop is bounded by socket timeouts, and
:meth:`FaultProxy.stop` ends it.
"""

from __future__ import annotations

import dataclasses
import http.client
import socket
import socketserver
import struct
import threading
import time
from typing import Any

_SLOW_DOWN = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>SlowDown</Code>'
    b"<Message>Please reduce your request rate.</Message><RequestId>fault</RequestId></Error>"
)
_EXPIRED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Request has expired</Message><RequestId>fault</RequestId></Error>"
)
_HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length"}
_SEND_PIECE = 64 * 2**10


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    # The default backlog of 5 drops connections a loader opens at once; each dropped SYN waits
    # 1 s for a retransmit, a stall no real store makes a client wait.
    request_queue_size = 128


@dataclasses.dataclass
class Rule:
    """One fault. ``nth``: the first matching request it applies to (1-based); ``times``: how
    many consecutive matching requests from there on (``0`` = all of them)."""

    action: str
    method: str | None = None
    path_contains: str | None = None
    nth: int = 1
    times: int = 1
    after_bytes: int = 0
    stall_s: float = 0.0
    matched: int = 0
    hits: int = 0

    def applies(self, method: str, target: str) -> bool:
        if self.method and method != self.method:
            return False
        if self.path_contains and self.path_contains not in target:
            return False
        self.matched += 1
        if self.matched < self.nth or (self.times and self.matched >= self.nth + self.times):
            return False
        self.hits += 1
        return True


class _Closed(Exception):
    """The client went away."""


class FaultProxy:
    """Threaded proxy on ``127.0.0.1:<free port>`` forwarding to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self.rules: list[Rule] = []
        self.requests: list[tuple[str, str]] = []
        self.body_bytes_sent = 0
        self.delay_s = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve_connection(self.request)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def endpoint_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def add(self, **rule: Any) -> Rule:
        """Add a :class:`Rule` and return it (to read its ``hits`` later)."""
        added = Rule(**rule)
        with self._lock:
            self.rules.append(added)
        return added

    def clear(self) -> None:
        """Forget rules and counters, once answers still being sent (an earlier test's
        prefetches) are done: their bytes would count for the next test."""
        self.sent_bytes()
        with self._lock:
            self.rules.clear()
            self.requests.clear()
            self.body_bytes_sent = 0
            self.delay_s = 0.0
            self.max_in_flight = 0

    def sent_bytes(self, timeout_s: float = 5.0) -> int:
        """``body_bytes_sent`` once no answer is in progress: a client can have read a whole
        body before the proxy's thread has counted its last piece."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if self.in_flight == 0:
                    return self.body_bytes_sent
            time.sleep(0.005)
        with self._lock:
            return self.body_bytes_sent

    def count(self, method: str, path_contains: str = "") -> int:
        """Requests seen with ``method`` whose target contains ``path_contains``."""
        with self._lock:
            return sum(1 for m, t in self.requests if m == method and path_contains in t)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def _pick_rule(self, method: str, target: str) -> Rule | None:
        with self._lock:
            self.requests.append((method, target))
            for rule in self.rules:
                if rule.applies(method, target):
                    return rule
        return None

    def _serve_connection(self, client: socket.socket) -> None:
        client.settimeout(30)
        # A head and a body are two sends: without this the body waits for the client's
        # delayed ACK of the head (40 ms a request on Linux loopback).
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        reader = client.makefile("rb")
        try:
            while True:
                request = _read_request(reader, client)
                if request is None:
                    return
                method, target, headers, body = request
                rule = self._pick_rule(method, target)
                if not self._answer(client, rule, method, target, headers, body):
                    return
        except (OSError, _Closed):
            return
        finally:
            reader.close()
            client.close()

    def _answer(
        self, client: socket.socket, rule: Rule | None, method: str, target: str,
        headers: list[tuple[str, str]], body: bytes,
    ) -> bool:  # fmt: skip
        """Answer one request after ``delay_s``, counting it as in flight meanwhile."""
        asked = time.monotonic()
        with self._lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                time.sleep(max(0.0, asked + self.delay_s - time.monotonic()))
            return self._respond(client, rule, method, target, headers, body)
        finally:
            with self._lock:
                self.in_flight -= 1

    def _respond(
        self, client: socket.socket, rule: Rule | None, method: str, target: str,
        headers: list[tuple[str, str]], body: bytes,
    ) -> bool:  # fmt: skip
        """Answer one request; False when the connection must end."""
        action = rule.action if rule else None
        if action in ("503", "403"):
            body = _SLOW_DOWN if action == "503" else _EXPIRED
            reason = "Slow Down" if action == "503" else "Forbidden"
            _send_head(client, int(action), reason, [("Content-Type", "application/xml")],
                       len(body))  # fmt: skip
            if method != "HEAD":  # an answer to HEAD has no body (the client would read it
                client.sendall(body)  # as the start of the next answer on the connection)
            return True
        if action in ("reset", "stall") and rule is not None and rule.after_bytes == 0:
            if action == "reset":
                _reset(client)
                return False
            time.sleep(rule.stall_s)
        status, reason, out_headers, data = self._forward(method, target, headers, body)
        length = len(data) if method != "HEAD" else _content_length(out_headers)
        _send_head(client, status, reason, out_headers, length)
        if method == "HEAD":
            return True
        cut_at = rule.after_bytes if rule and rule.after_bytes and action else len(data)
        self._send_body(client, data[:cut_at])
        if cut_at >= len(data):
            return True
        assert rule is not None
        if action == "reset":
            _reset(client)
            return False
        if action == "cut":
            client.shutdown(socket.SHUT_RDWR)
            return False
        time.sleep(rule.stall_s)  # "stall" mid-body, then go on if the client is still there
        self._send_body(client, data[cut_at:])
        return True

    def _send_body(self, client: socket.socket, data: bytes) -> None:
        for start in range(0, len(data), _SEND_PIECE):
            piece = data[start : start + _SEND_PIECE]
            with self._lock:  # counted first: the client may have it all before sendall returns
                self.body_bytes_sent += len(piece)
            client.sendall(piece)

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        connection = http.client.HTTPConnection(*self.upstream, timeout=30)
        try:
            connection.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            for name, value in headers:
                if name.lower() not in ("transfer-encoding", "content-length"):
                    connection.putheader(name, value)
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body)
            response = connection.getresponse()
            data = response.read()
            kept = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_HEADERS]
            if method == "HEAD":
                kept.append(("Content-Length", response.getheader("Content-Length", "0")))
            return response.status, response.reason, kept, data
        finally:
            connection.close()


def _content_length(headers: list[tuple[str, str]]) -> int:
    for name, value in headers:
        if name.lower() == "content-length":
            return int(value)
    return 0


def _send_head(
    client: socket.socket, status: int, reason: str, headers: list[tuple[str, str]], length: int
) -> None:
    lines = [f"HTTP/1.1 {status} {reason}"]
    lines += [f"{k}: {v}" for k, v in headers if k.lower() != "content-length"]
    lines.append(f"Content-Length: {length}")
    client.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))


def _reset(client: socket.socket) -> None:
    # SO_LINGER with a zero timeout turns close() into a TCP RST (ECONNRESET at the client).
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()


def _read_request(
    reader: Any, client: socket.socket
) -> tuple[str, str, list[tuple[str, str]], bytes] | None:
    line = reader.readline(65537)
    if not line:
        return None
    method, target, _version = line.decode("latin-1").split(" ", 2)
    headers: list[tuple[str, str]] = []
    for _ in range(200):
        raw = reader.readline(65537)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers.append((name.strip(), value.strip()))
    lookup = {k.lower(): v for k, v in headers}
    if lookup.get("expect", "").lower() == "100-continue":  # botocore does this for uploads
        client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        headers = [(k, v) for k, v in headers if k.lower() != "expect"]
    if lookup.get("transfer-encoding", "").lower() == "chunked":
        body = _read_chunked(reader)
    else:
        body = reader.read(int(lookup.get("content-length", "0") or 0))
    return method, target, headers, body


def _read_chunked(reader: Any) -> bytes:
    parts = []
    for _ in range(1_000_000):
        size = int(reader.readline(1024).split(b";")[0].strip() or b"0", 16)
        if size == 0:
            reader.readline(1024)
            break
        parts.append(reader.read(size))
        reader.readline(1024)
    return b"".join(parts)
