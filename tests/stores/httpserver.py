"""A Range-capable HTTP/1.1 file server on 127.0.0.1 for the tests: threaded, keep-alive, ETag.

It serves a folder as a static web server does: ``GET`` and ``HEAD``, one byte range per request
(``206`` with ``Content-Range``; ``416`` past the end), ``ETag`` and ``Last-Modified`` from the
file's size and modification time, ``If-Range`` (a range only while the validator matches, the
whole file otherwise) and ``If-Match`` (``412``), and folder listings as HTML links (what
fsspec's HTTP filesystem lists). ``requests`` counts what was asked (method, path, range).
"""

from __future__ import annotations

import email.utils
import html
import http.server
import os
import re
import threading
import urllib.parse
from typing import Any

_RANGE = re.compile(r"bytes=(\d*)-(\d*)$")


class RangeServer:
    """Serves ``root`` on ``127.0.0.1:<free port>`` until :meth:`stop`."""

    def __init__(self, root: str) -> None:
        self.root = os.path.abspath(root)
        self.requests: list[tuple[str, str, str | None]] = []
        self._lock = threading.Lock()
        server = self

        class Handler(_Handler):
            owner = server

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def count(self, method: str, path_contains: str = "") -> int:
        with self._lock:
            return sum(1 for m, p, _ in self.requests if m == method and path_contains in p)

    def clear(self) -> None:
        with self._lock:
            self.requests.clear()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


class _Server(http.server.ThreadingHTTPServer):
    # socketserver's default backlog of 5 drops the connections a loader opens at once (dozens
    # of ranged GETs in flight): each dropped SYN waits for a retransmit, 1 s and then 3 s, which
    # web servers (nginx: 511) never make a client wait.
    request_queue_size = 128


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive
    disable_nagle_algorithm = True  # the head and the body are two writes: send both at once
    owner: RangeServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read ``requests`` instead."""

    def do_HEAD(self) -> None:
        self._serve(body=False)

    def do_GET(self) -> None:
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path)
        with self.owner._lock:
            self.owner.requests.append((self.command, path, self.headers.get("Range")))
        local = os.path.normpath(os.path.join(self.owner.root, path.lstrip("/")))
        if not local.startswith(self.owner.root):
            return self._status(403)
        if os.path.isdir(local):
            return self._listing(local, path, body)
        try:
            with open(local, "rb") as stream:
                info = os.fstat(stream.fileno())
                etag = f'"{info.st_mtime_ns:x}-{info.st_size:x}"'
                modified = email.utils.formatdate(info.st_mtime, usegmt=True)
                if self.headers.get("If-Match") not in (None, "*", etag):
                    return self._status(412)
                start, stop = self._range(info.st_size, etag, modified)
                if start < 0:
                    return self._status(416, [("Content-Range", f"bytes */{info.st_size}")])
                stream.seek(start)
                data = stream.read(stop - start) if body else b""
        except FileNotFoundError:
            return self._status(404)
        self.send_response(206 if self._ranged else 200)
        if self._ranged:
            self.send_header("Content-Range", f"bytes {start}-{stop - 1}/{info.st_size}")
        self.send_header("Content-Length", str(stop - start))
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", modified)
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _range(self, size: int, etag: str, modified: str) -> tuple[int, int]:
        """``(start, stop)`` to send; ``(-1, -1)`` when the range is not satisfiable."""
        self._ranged = False
        asked = self.headers.get("Range")
        condition = self.headers.get("If-Range")
        if asked is None or (condition is not None and condition not in (etag, modified)):
            return 0, size
        found = _RANGE.match(asked.strip())
        if found is None:
            return 0, size
        first, last = found.groups()
        if not first:  # a suffix: the last N bytes
            start, stop = max(0, size - int(last or 0)), size
        else:
            start, stop = int(first), min(size, int(last) + 1 if last else size)
        if start >= size:
            return -1, -1
        self._ranged = True
        return start, stop

    def _listing(self, local: str, path: str, body: bool) -> None:
        base = path if path.endswith("/") else path + "/"
        links = "".join(
            f'<a href="{html.escape(base + name)}">{html.escape(name)}</a>\n'
            for name in sorted(os.listdir(local))
        )
        data = f"<html><body>\n{links}</body></html>\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)

    def _status(self, status: int, headers: list[tuple[str, str]] | None = None) -> None:
        self.send_response(status)
        for name, value in headers or []:
            self.send_header(name, value)
        self.send_header("Content-Length", "0")
        self.end_headers()
