"""In-memory stand-ins for storage: a ranged object that fails where a test says, an extent list.

``FakeObject`` implements :class:`~shardstream._storage.remote.ranged.RangeSource` (and its bodies
``RangeBody``); ``FakeExtents`` implements ``ExtentSource``. Both count what was asked of them, so
tests can check where each request started and that every response was closed.
"""

from __future__ import annotations

import dataclasses
import random
import threading
from collections.abc import Callable, Sequence

from botocore.exceptions import ClientError


def random_bytes(num_bytes: int, seed: int = 0) -> bytes:
    """Bytes without repeats, so a lost or doubled block is always visible."""
    return random.Random(seed).randbytes(num_bytes)


def slow_down() -> ClientError:
    response = {
        "Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
        "ResponseMetadata": {"HTTPStatusCode": 503},
    }
    return ClientError(response, "GetObject")


@dataclasses.dataclass
class Fault:
    """Fail when a response reaches byte ``offset`` (or, for ``open-*``, when one starts there).

    Kinds: ``reset`` (ConnectionResetError mid-body), ``stall`` (TimeoutError mid-body), ``cut``
    (the body ends early, a short read), ``open-503`` (SlowDown on the request), ``open-missing``
    (FileNotFoundError on the request), ``denied`` (PermissionError mid-body).
    """

    offset: int
    kind: str
    times: int = 1

    def error(self) -> BaseException:
        return {
            "reset": lambda: ConnectionResetError(104, "Connection reset by peer"),
            "stall": lambda: TimeoutError("no bytes for 60 s"),
            "denied": lambda: PermissionError(13, "Access Denied"),
            "open-503": slow_down,
            "open-missing": lambda: FileNotFoundError(2, "NoSuchKey"),
        }[self.kind]()


class FakeObject:
    """A remote object in memory, read by ranged requests that fail at chosen offsets.

    Args:
        data: The object's bytes.
        faults: Where and how requests fail; each fault fires ``times`` times.
        publish_size: Set ``total_size`` from the first response, like S3's ``Content-Range``.
    """

    def __init__(
        self, data: bytes, faults: Sequence[Fault] = (), publish_size: bool = False
    ) -> None:
        self.data, self.faults, self.publish_size = data, list(faults), publish_size
        self.total_size: int | None = None
        self.opens: list[tuple[int, int]] = []
        self.open_bodies = 0
        self.fired: list[Fault] = []
        self._lock = threading.Lock()

    def take_fault(self, offset: int, kinds: tuple[str, ...]) -> Fault | None:
        with self._lock:
            for fault in self.faults:
                if fault.offset == offset and fault.kind in kinds and fault.times > 0:
                    fault.times -= 1
                    self.fired.append(fault)
                    return fault
        return None

    def next_fault_after(self, offset: int) -> int | None:
        """The first armed mid-body fault strictly after ``offset``."""
        with self._lock:
            ahead = [
                f.offset
                for f in self.faults
                if f.times > 0 and f.offset > offset and not f.kind.startswith("open-")
            ]
        return min(ahead, default=None)

    def open_body(self, offset: int, end: int) -> FakeBody:
        self.opens.append((offset, end))
        fault = self.take_fault(offset, ("open-503", "open-missing"))
        if fault is not None:
            raise fault.error()
        if self.publish_size:
            self.total_size = len(self.data)
        self.open_bodies += 1
        return FakeBody(self, offset, min(end, len(self.data)))


class FakeBody:
    """One open response: delivers bytes up to the next fault, then fails there."""

    def __init__(self, source: FakeObject, offset: int, end: int) -> None:
        self.source, self.position, self.end = source, offset, end
        self.closed = False

    def read_extent(self, num_bytes: int) -> bytes:
        if self.closed:
            raise AssertionError("read from a closed body")
        fault = self.source.take_fault(self.position, ("reset", "stall", "denied", "cut"))
        if fault is not None:
            if fault.kind == "cut":
                return b""
            raise fault.error()
        stop = min(self.position + num_bytes, self.end)
        next_fault = self.source.next_fault_after(self.position)
        if next_fault is not None:
            stop = min(stop, next_fault)  # deliver up to the fault; the next read fails
        data = self.source.data[self.position : stop]
        self.position += len(data)
        return data

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.source.open_bodies -= 1


class FakeExtents:
    """A ExtentSource over fixed extents; raises ``error`` instead of extent ``fail_at``.

    Args:
        extents: What ``next_extent()`` returns, in order, before ``None``.
        fail_at: Index of the extent replaced by ``error``, or ``None``.
        error: The exception raised there.
    """

    def __init__(
        self, extents: list[bytes], fail_at: int | None = None, error: BaseException | None = None
    ) -> None:
        self.extents, self.fail_at, self.error = extents, fail_at, error
        self.index = 0
        self.calls = 0
        self.calls_after_close = 0
        self.seeks: list[int] = []
        self.closed = False
        self.on_call: list[Callable[[], None]] = []  # called on every next_extent

    def next_extent(self) -> bytes | None:
        self.calls += 1
        if self.closed:
            self.calls_after_close += 1
        for hook in self.on_call:
            hook()
        if self.index == self.fail_at and self.error is not None:
            raise self.error
        if self.index >= len(self.extents):
            return None
        extent = self.extents[self.index]
        self.index += 1
        return extent

    def seek(self, offset: int) -> None:
        """Extents are of equal size; ``offset`` is a multiple of it."""
        self.seeks.append(offset)
        self.index = offset // len(self.extents[0])

    def close(self) -> None:
        self.closed = True
