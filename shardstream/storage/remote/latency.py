"""How many GETs to keep in flight: set from the store's measured first-byte latency.

A GET of ``n`` bytes holds its connection for ``first_byte_s + transfer_s``: the store's delay
before the first byte, then the bytes at the connection's speed. ``fewest`` requests in
flight are enough where the first-byte delay is small next to the transfer (that is what
``ReadOptions.min_requests`` is tuned for); to deliver the same bytes per second when every
request first waits, Little's law asks for ``fewest * (first_byte_s + transfer_s) /
transfer_s`` of them. :class:`LatencyGauge` keeps a running mean of that ratio over the GETs
of a process and answers with the count, between ``fewest`` and ``most``.

More requests in flight cost no extra memory of their own: what is fetched ahead is bounded by
the byte budgets of the callers that submit spans (``ReadOptions.read_ahead_bytes`` per open
stream, ``ReadOptions.prefetch_bytes`` per process); threads only run what was submitted.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

__all__ = ["LatencyGauge", "TimedSource"]

#: Weight of the newest GET in the running mean (about the last ten GETs count).
_WEIGHT = 0.1
#: A transfer is never taken as shorter than this (tiny ranges would make the ratio explode).
_MIN_TRANSFER_S = 0.5e-3
#: The ratio is clamped here: beyond it the request count is at ``most`` anyway.
_MAX_RATIO = 1000.0


class LatencyGauge:
    """Running mean of first-byte delay over transfer time, per GET, and what it asks for.

    Examples:
        >>> gauge = LatencyGauge()
        >>> for _ in range(50):
        ...     gauge.record(first_byte_s=0.030, transfer_s=0.010)
        >>> gauge.requests_in_flight(fewest=4, most=64)
        16
    """

    def __init__(self) -> None:
        self._ratio = 0.0
        self._first_byte_s = 0.0
        self._count = 0
        self._lock = threading.Lock()

    @property
    def first_byte_s(self) -> float:
        """Running mean of the store's delay to the first byte of a GET (seconds)."""
        return self._first_byte_s

    @property
    def num_measured(self) -> int:
        """GETs measured so far."""
        return self._count

    def record(self, first_byte_s: float, transfer_s: float) -> None:
        """Count one GET: seconds to its first byte, then seconds for its bytes."""
        ratio = min(_MAX_RATIO, max(0.0, first_byte_s) / max(transfer_s, _MIN_TRANSFER_S))
        with self._lock:
            weight = max(_WEIGHT, 1.0 / (self._count + 1))  # the first GETs count fully
            self._ratio += weight * (ratio - self._ratio)
            self._first_byte_s += weight * (first_byte_s - self._first_byte_s)
            self._count += 1

    def requests_in_flight(self, fewest: int, most: int) -> int:
        """``fewest * (1 + first_byte / transfer)``, between ``fewest`` and ``most``."""
        fewest = max(1, fewest)
        wanted = math.ceil(fewest * (1.0 + self._ratio))
        return max(fewest, min(max(fewest, most), wanted))


class TimedSource:
    """A :class:`~shardstream.storage.remote.ranged.RangeSource` that times its ``open_body`` calls
    (a GET returns its body once the response's head, the first byte, has arrived)."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.num_opens = 0
        self.first_byte_s = 0.0

    @property
    def total_size(self) -> int | None:
        return getattr(self._source, "total_size", None)

    def open_body(self, offset: int, end: int) -> Any:
        started = time.monotonic()
        body = self._source.open_body(offset, end)
        self.first_byte_s = time.monotonic() - started
        self.num_opens += 1
        return body
