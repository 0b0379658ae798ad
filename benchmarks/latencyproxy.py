"""A TCP proxy on 127.0.0.1 that makes a fast S3 server answer like a data center's store.

Every HTTP request that passes through waits ``--delay-ms`` (from the moment its headers arrive)
before the first byte of its response reaches the client; bytes then flow at the server's own
speed. Connections stay open across requests (keep-alive), as with a real store, so only the
first request of a connection pays for the TCP handshake, and that costs nothing here.

How it works, per client connection, two threads and one upstream connection:

- client -> server: reads the HTTP framing of requests (the head, then ``Content-Length`` or
  chunked body bytes) so that it knows where each request starts; the moment a request's head is
  complete is queued, and the bytes are forwarded unchanged.
- server -> client: when response bytes arrive and a request is waiting for its first byte, the
  thread sleeps until that request's moment plus the delay, then forwards. Clients do not
  pipeline (botocore, aiohttp), so the next request's head can only arrive after the previous
  response has passed: a queued moment always belongs to the response that comes next. An
  interim ``100 Continue`` takes the delay; the final answer after the body does not wait again.
  Bytes move with ``os.splice`` (kernel to kernel, no copies through Python), so the proxy's
  own CPU stays small next to the client's and the server's.

Run ``python benchmarks/latencyproxy.py --upstream 127.0.0.1:7480 --delay-ms 30``: it prints
``{"endpoint_url": ...}`` on its first line and serves until killed. :func:`latency_proxy`
starts one as a child process from Python (its CPU is not counted as the client's).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

_PIPE_BYTES = 1 << 20
_HEAD_LIMIT = 64 * 1024


class _Framing:
    """Finds where requests start in the bytes a client sends (heads and bodies)."""

    def __init__(self) -> None:
        self._head = b""
        self._body_left = 0  # bytes of the current body still to come
        self._chunked = False
        self._chunk_line = b""

    def feed(self, data: bytes) -> int:
        """Take the next bytes; return how many new request heads were completed in them."""
        heads = 0
        view = memoryview(data)
        while len(view):
            if self._body_left:
                step = min(self._body_left, len(view))
                self._body_left -= step
                view = view[step:]
            elif self._chunked:
                view = self._feed_chunked(view)
            else:
                end = (self._head + bytes(view[:_HEAD_LIMIT])).find(b"\r\n\r\n")
                if end < 0:
                    self._head += bytes(view)
                    if len(self._head) > _HEAD_LIMIT:
                        raise ValueError("request head over 64 KiB: not HTTP/1.1 from a client?")
                    return heads
                used = end + 4 - len(self._head)
                self._start_body((self._head + bytes(view[:used])).decode("latin-1"))
                self._head = b""
                view = view[used:]
                heads += 1
        return heads

    def _start_body(self, head: str) -> None:
        fields = {}
        for line in head.split("\r\n")[1:]:
            name, _, value = line.partition(":")
            fields[name.strip().lower()] = value.strip()
        self._chunked = fields.get("transfer-encoding", "").lower() == "chunked"
        self._body_left = 0 if self._chunked else int(fields.get("content-length", "0") or 0)

    def _feed_chunked(self, view: memoryview) -> memoryview:
        """Consume chunk-size lines; a zero chunk ends the body (trailers are not sent by S3
        clients, so the final CRLF follows at once)."""
        line = self._chunk_line + bytes(view[:_HEAD_LIMIT])
        end = line.find(b"\r\n")
        if end < 0:
            self._chunk_line = line
            return view[len(view) :]
        used = end + 2 - len(self._chunk_line)
        size = int(line[:end].split(b";")[0] or b"0", 16)
        self._chunk_line = b""
        if size == 0:
            self._chunked = False
            self._body_left = 2  # the CRLF after the last chunk
        else:
            self._body_left = size + 2  # data, then its CRLF
        return view[used:]


class _Connection:
    """One client connection and its upstream connection, pumped by two threads."""

    def __init__(self, client: socket.socket, upstream: tuple[str, int], delay_s: float) -> None:
        self.client = client
        self.server = socket.create_connection(upstream)
        for side in (self.client, self.server):
            side.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.delay_s = delay_s
        self.waiting: collections.deque[float] = collections.deque()
        self.lock = threading.Lock()

    def run(self) -> None:
        down = threading.Thread(target=self._down, daemon=True)
        down.start()
        try:
            self._up()
        finally:
            with contextlib.suppress(OSError):
                self.server.shutdown(socket.SHUT_WR)
            down.join()
            self.client.close()
            self.server.close()

    def _up(self) -> None:
        framing = _Framing()
        with contextlib.suppress(OSError, ValueError):
            while data := self.client.recv(1 << 20):
                now = time.monotonic()
                heads = framing.feed(data)
                with self.lock:
                    self.waiting.extend([now] * heads)
                self.server.sendall(data)

    def _down(self) -> None:
        read_end, write_end = os.pipe()
        with contextlib.suppress(OSError):  # a bigger pipe: fewer system calls per response
            fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        try:
            self._pump_down(read_end, write_end)
        except OSError:
            pass
        finally:
            os.close(read_end)
            os.close(write_end)
            with contextlib.suppress(OSError):
                self.client.shutdown(socket.SHUT_RDWR)

    def _pump_down(self, read_end: int, write_end: int) -> None:
        server, client = self.server.fileno(), self.client.fileno()
        while True:
            moved = os.splice(server, write_end, _PIPE_BYTES)  # blocks until bytes arrive
            if moved == 0:
                return
            with self.lock:
                asked = self.waiting.popleft() if self.waiting else None
            if asked is not None:
                wait = asked + self.delay_s - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
            while moved:
                moved -= os.splice(read_end, client, moved)


def serve(listener: socket.socket, upstream: tuple[str, int], delay_s: float) -> None:
    """Accept connections forever, each served by its own threads."""
    while True:
        client, _ = listener.accept()
        connection = _Connection(client, upstream, delay_s)
        threading.Thread(target=connection.run, daemon=True).start()


class RunningProxy:
    """A proxy child process: where to send requests, and its pid (to leave its CPU out)."""

    def __init__(self, endpoint_url: str, pid: int) -> None:
        self.endpoint_url, self.pid = endpoint_url, pid


@contextlib.contextmanager
def latency_proxy(endpoint_url: str, delay_ms: float) -> Iterator[RunningProxy]:
    """A proxy child process in front of ``endpoint_url``; stopped on exit."""
    host_port = endpoint_url.split("//", 1)[1].rstrip("/")
    process = subprocess.Popen(
        [sys.executable, __file__, "--upstream", host_port, "--delay-ms", str(delay_ms)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        line = process.stdout.readline() if process.stdout else ""
        if not line:
            raise RuntimeError("the latency proxy exited before it listened")
        yield RunningProxy(json.loads(line)["endpoint_url"], process.pid)
    finally:
        process.kill()
        process.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="HOST:PORT of the S3 server")
    parser.add_argument("--delay-ms", type=float, default=30.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    host, upstream_port = args.upstream.rsplit(":", 1)
    listener = socket.create_server(("127.0.0.1", args.port), backlog=128)
    port = listener.getsockname()[1]
    print(json.dumps({"endpoint_url": f"http://127.0.0.1:{port}"}), flush=True)
    serve(listener, (host, int(upstream_port)), args.delay_ms / 1000)


if __name__ == "__main__":
    main()
