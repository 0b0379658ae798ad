"""Byte ranges announced before they are opened: fetched in the background within a budget.

A streaming worker knows which pieces of which shards it will open next (its window's plan),
but opens each only when its first sample is due, and every open on an object store waits for
a first byte. :class:`PrefetchQueue` takes those
announcements (:meth:`PrefetchQueue.hint`), opens the ranges ahead of use as background
streams (their spans fetched by the shared :class:`FetchPool`),
and hands a stream over when the same range is opened (:meth:`PrefetchQueue.take`).

Memory bound: the streams opened ahead and not yet taken cover at most ``budget_bytes`` per
process (``ReadOptions.prefetch_bytes``); the rest of the announced ranges wait as plain
``(key, size)`` entries and start as taken ones free the budget. Each group of hints (one per
reader of a stream of pieces) replaces that group's previous hints, and :meth:`forget` closes
what a group no longer needs, so nothing announced and never opened lingers.

How many GETs to keep in flight: set from the store's measured first-byte latency.

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

Several ranged GETs in flight per process: a shared fetch pool and a span prefetcher.

An object store answers each request after a fixed delay, and one connection carries a fraction
of what several at once do (README, *Benchmarks*): a DataLoader worker that waits for one GET at
a time leaves most of the server idle, and its decoding waits on the network. Here:

- :class:`FetchPool` is one set of daemon threads per process, shared by every open stream, that
  runs span fetches in the order submitted: ``ReadOptions.min_requests`` of them where the store
  answers fast, more (up to ``max_requests``) as its measured first-byte latency grows.
- :class:`SpanPrefetcher` is the :class:`~.ranged.ExtentSource` of a bounded byte range: it
  cuts the range into spans and keeps the next ones submitted to the pool, so the rest of a
  piece arrives while the caller decodes its first samples and opens other pieces. A caller
  that needs a span nobody has started yet fetches it itself (no waiting behind other
  streams' queued spans).

Memory bound: a prefetcher holds at most ``max(ahead_bytes, span_bytes)`` of fetched or
in-flight bytes that the caller has not taken yet, per open stream (``ReadOptions.
read_ahead_bytes``); the pool only runs what was submitted, one span per thread."""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import IO, Any

from shardstream._storage.background import ProcessLocal
from shardstream._storage.options import ReadOptions
from shardstream._storage.remote.ranged import Extent, ExtentFetcher
from shardstream._storage.remote.retry import Retrier

__all__ = [
    "FetchPool",
    "LatencyGauge",
    "PrefetchQueue",
    "SpanJob",
    "SpanPrefetcher",
    "TimedSource",
    "forget",
    "pool_for",
    "process_queue",
    "range_key",
    "shared_pool",
    "span_fetch",
    "take",
]


Opener = Callable[[], IO[bytes]]


class PrefetchQueue:
    """Ranges opened ahead of use, in announced order, within ``budget_bytes``.

    Args:
        budget_bytes: Bytes of ranges opened ahead and not yet taken, at most (one range is
            always allowed, however large).
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._pending: collections.OrderedDict[Hashable, tuple[Hashable, int, Opener]] = (
            collections.OrderedDict()
        )
        self._ready: dict[Hashable, tuple[Hashable, int, IO[bytes]]] = {}
        self._used = 0
        self._lock = threading.Lock()

    @property
    def used_bytes(self) -> int:
        """Bytes of ranges opened ahead and not yet taken."""
        return self._used

    def hint(self, group: Hashable, ranges: Sequence[tuple[Hashable, int, Opener]]) -> None:
        """Announce ``(key, num_bytes, opener)`` ranges, soonest first, replacing ``group``'s.

        Ranges of the group that are open already and announced again are kept; the others
        of the group are closed. A range another group announced (and has not opened) moves to
        ``group``: the streams of a next pass announced while the last one ended are taken
        over by the next pass's readers, and what they do not announce goes with the old group.
        """
        wanted = {key for key, _, _ in ranges}
        self.forget(group, keep=wanted)
        with self._lock:
            for key, size, opener in ranges:
                if key in self._ready:
                    _, held, stream = self._ready[key]
                    self._ready[key] = (group, held, stream)
                elif key in self._pending:
                    self._pending[key] = (group, *self._pending[key][1:])
                else:
                    self._pending[key] = (group, size, opener)
        self._start()

    def take(self, key: Hashable) -> IO[bytes] | None:
        """The stream opened ahead for ``key`` (the caller owns it now), or None."""
        with self._lock:
            self._pending.pop(key, None)  # opened now by the caller, not ahead
            entry = self._ready.pop(key, None)
            if entry is not None:
                self._used -= entry[1]
        if entry is None:
            return None
        self._start()
        return entry[2]

    def forget(self, group: Hashable, keep: set[Hashable] | None = None) -> None:
        """Drop ``group``'s announced ranges (but those in ``keep``); close their streams."""
        closing = []
        with self._lock:
            for key in [k for k, v in self._pending.items() if v[0] == group]:
                if keep is None or key not in keep:
                    del self._pending[key]
            for key in [k for k, v in self._ready.items() if v[0] == group]:
                if keep is None or key not in keep:
                    _, size, stream = self._ready.pop(key)
                    self._used -= size
                    closing.append(stream)
        for stream in closing:
            stream.close()
        if closing:
            self._start()

    def _start(self) -> None:
        """Open announced ranges, soonest first, while the budget allows."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                key, (group, size, opener) = next(iter(self._pending.items()))
                if self._ready and self._used + size > self.budget_bytes:
                    return
                del self._pending[key]
                self._used += size
            try:
                stream = opener()  # submits the range's spans to the pool; does not wait
            except Exception:  # the caller's own open will meet (and report) the problem
                with self._lock:
                    self._used -= size
                continue
            with self._lock:
                self._ready[key] = (group, size, stream)


_queue: ProcessLocal[PrefetchQueue] = ProcessLocal(lambda: PrefetchQueue(0))


def process_queue(budget_bytes: int) -> PrefetchQueue:
    """This process's queue (a forked child gets its own), its budget raised to at least this."""
    queue = _queue.get()
    queue.budget_bytes = max(queue.budget_bytes, budget_bytes)
    return queue


def range_key(fs: Any, path: str, start: int, end: int) -> Hashable:
    """What identifies an announced range: the filesystem instance, path and bytes."""
    return (id(fs), path, start, end)


def take(key: Hashable) -> IO[bytes] | None:
    """This process's stream opened ahead for ``key`` (see :meth:`PrefetchQueue.take`)."""
    queue = _queue.peek()
    return None if queue is None else queue.take(key)


def forget(group: Hashable) -> None:
    """Drop this process's announcements of ``group`` (see :meth:`PrefetchQueue.forget`)."""
    queue = _queue.peek()
    if queue is not None:
        queue.forget(group)


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
    """A :class:`~shardstream._storage.remote.ranged.RangeSource` that times its ``open_body`` calls
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


#: A pool thread with no work for this long exits (a later submit starts a new one).
_IDLE_EXIT_S = 10.0

FetchFn = Callable[[int, int], "Extent"]


class SpanJob:
    """One span fetch: run once, by a pool thread or by the caller that needs it first."""

    def __init__(self, fetch: FetchFn, start: int, end: int) -> None:
        self.start, self.end = start, end
        self._fetch = fetch
        self._state = "pending"  # -> running -> done, or pending -> cancelled
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._result: Extent = b""
        self._error: BaseException | None = None

    def _claim(self) -> bool:
        with self._lock:
            if self._state != "pending":
                return False
            self._state = "running"
            return True

    def run(self) -> None:
        """Fetch the span, unless it was started elsewhere or cancelled."""
        if not self._claim():
            return
        try:
            self._result = self._fetch(self.start, self.end)
        except BaseException as exc:  # handed to the caller of result()
            self._error = exc
        finally:
            with self._lock:
                self._state = "done"
            self._done.set()

    def result(self) -> Extent:
        """The span's bytes; fetched here if no thread has started it; errors re-raised."""
        self.run()
        self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result

    def cancel(self) -> None:
        """Drop the job if it has not started (a running fetch finishes and is discarded)."""
        with self._lock:
            if self._state == "pending":
                self._state = "cancelled"
        self._result = b""


class FetchPool:
    """Daemon threads running :class:`SpanJob` s first in, first out, as many as the store's
    latency asks for.

    Between ``min_threads`` and ``max_threads`` threads run at once: :attr:`gauge` measures
    each GET's first-byte delay against its transfer time and asks for more requests in flight
    when the store answers slowly (see this module's docstring). Threads start on
    demand and exit after ``idle_exit_s`` without work, or when the count asked for drops.
    """

    def __init__(
        self, max_threads: int, idle_exit_s: float = _IDLE_EXIT_S, min_threads: int | None = None
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.min_threads = self.max_threads if min_threads is None else max(1, min_threads)
        self.gauge = LatencyGauge()
        self._idle_exit_s = idle_exit_s
        self._jobs: collections.deque[SpanJob] = collections.deque()
        self._openings: collections.deque[SpanJob] = collections.deque()  # run before _jobs
        self._cold: collections.deque[SpanJob] = collections.deque()  # run before, and alone
        self._cold_running = 0
        self._cond = threading.Condition()
        self._threads = 0
        self._idle = 0

    @property
    def num_threads(self) -> int:
        """Threads alive now."""
        return self._threads

    @property
    def wanted_threads(self) -> int:
        """Threads (GETs in flight) the measured latency asks for now."""
        return self.gauge.requests_in_flight(self.min_threads, self.max_threads)

    def submit(self, job: SpanJob, opening: bool = False, cold: bool = False) -> None:
        """Queue ``job``; start the pool's first thread if it has none (see
        :meth:`_claim_starts` for the others).

        ``opening`` jobs (the first span of an announced piece) run before every other queued
        job: a batch draws its first samples from many pieces at once, so their openings are
        what it waits for. With all GETs in flight sharing the store's bandwidth, a piece's
        remaining spans queued ahead of the next piece's opening would delay it by their bytes.
        ``cold`` jobs (the openings of a fresh process's first pieces, what its first batch
        waits on) run first and alone: no other job starts while one is queued or running, so
        the next pieces' bytes do not share the store with them (a caller that needs another
        span meanwhile fetches it itself, as always).
        """
        with self._cond:
            queue = self._cold if cold else self._openings if opening else self._jobs
            queue.append(job)
            self._cond.notify()
            starts = 0
            if self._threads == 0:  # the first thread; it starts any more the count asks for
                starts = self._threads = 1
        self._start(starts)

    def _claim_starts(self) -> int:
        """Threads to start for queued jobs that no idle thread takes, up to the count asked
        for (called with the lock held; after each job too, as measurements raise the count).

        They are counted here and started by :meth:`_start` after the lock is released: a
        thread's start waits until the new thread runs, which on a busy host takes
        milliseconds. A submitter (the training loop's reader) starts only the first thread,
        when there is none; pool threads start the rest as they take jobs, so the reader never
        waits through dozens of starts when the measured latency asks for more requests.
        """
        queued = len(self._cold) + len(self._openings) + len(self._jobs)
        wanted = min(self.wanted_threads, self._threads + queued - self._idle)
        starts = max(0, wanted - self._threads)
        self._threads += starts
        return starts

    def _start(self, count: int) -> None:
        for started in range(count):
            try:
                threading.Thread(target=self._work, name="shardstream-fetch", daemon=True).start()
            except RuntimeError:  # out of threads: a job nobody started runs in its caller
                with self._cond:
                    self._threads -= count - started
                return

    def _runnable(self) -> bool:
        """Whether a queued job may start now (called with the lock held)."""
        return bool(self._cold) or (not self._cold_running and bool(self._openings or self._jobs))

    def _work(self) -> None:
        while True:
            with self._cond:
                self._idle += 1
                if not self._runnable():
                    self._cond.wait(self._idle_exit_s)
                self._idle -= 1
                if not self._runnable() or self._threads > self.wanted_threads:
                    self._threads -= 1
                    return
                cold = bool(self._cold)
                self._cold_running += cold
                job = (self._cold or self._openings or self._jobs).popleft()
                starts = self._claim_starts()
            self._start(starts)
            job.run()
            if cold:
                with self._cond:
                    self._cold_running -= 1
                    starts = 0
                    if not self._cold_running and not self._cold:  # the others may go now
                        self._cond.notify_all()
                        starts = self._claim_starts()
                self._start(starts)


_pool: ProcessLocal[FetchPool] = ProcessLocal(lambda: FetchPool(1))


def shared_pool(max_threads: int, min_threads: int | None = None) -> FetchPool:
    """This process's pool (a forked child gets its own), its limits raised to these if lower."""
    pool = _pool.get()
    pool.max_threads = max(pool.max_threads, max_threads)
    low = max_threads if min_threads is None else min(min_threads, max_threads)
    pool.min_threads = max(pool.min_threads, low)
    return pool


class SpanPrefetcher:
    """Extents of bytes ``[start, end)`` fetched ahead, span by span, through a :class:`FetchPool`.

    Args:
        fetch: ``fetch(a, b)`` returns bytes ``[a, b)`` (retrying and resuming on its own).
        start: First byte.
        end: Stop before this byte (the range's known end).
        span_bytes: Bytes per fetch (one ranged GET each).
        ahead_bytes: Bytes fetched or in flight that the caller has not taken, at most (at least
            one span is always under way).
        pool: Runs the fetches.
        stop: Set on close (ends the retry waits of running fetches), cleared on a seek.
        first_span_bytes: Bytes of the first span (after the start or a seek), if shorter
            than ``span_bytes``: the first bytes arrive sooner, the rest follows. That span
            also runs before the pool's other queued spans (``FetchPool.submit(opening=True)``).
        hold_rest: Ask for nothing past the first span until the caller has read half of it:
            the first span is handed out in two halves, and the rest is submitted when the
            second half is asked for. A reader that takes a sample or two from the range
            (a fresh worker's first batch, drawn from dozens of ranges) then moves no more
            bytes than those, and one that reads on has half a span to read while the rest
            is fetched.
        cold: The first span is one of a fresh process's first openings
            (``FetchPool.submit(cold=True)``).
    """

    def __init__(
        self, fetch: FetchFn, start: int, end: int, span_bytes: int, ahead_bytes: int,
        pool: FetchPool, stop: threading.Event | None = None, first_span_bytes: int = 0,
        hold_rest: bool = False, cold: bool = False,
    ) -> None:  # fmt: skip
        self._fetch, self._end, self._pool = fetch, end, pool
        self._stop = stop or threading.Event()
        self._span_bytes, self._ahead_bytes = max(1, span_bytes), ahead_bytes
        self._first_span_bytes = first_span_bytes
        self._jobs: collections.deque[SpanJob] = collections.deque()
        self._next = self._first = start
        self._closed = False
        self._hold_rest, self._cold = hold_rest, cold
        self._held: Extent | None = None  # the first span's second half, not handed out yet
        self._fill()
        self._cold = False  # a seek's new first span is no process's first

    @property
    def buffered_bytes(self) -> int:
        """Bytes submitted (fetched or in flight) and not yet taken by the caller."""
        return sum(job.end - job.start for job in self._jobs)

    @property
    def alive(self) -> bool:
        """True while spans are submitted and not yet taken."""
        return bool(self._jobs) or self._held is not None

    def _fill(self) -> None:
        queued = self.buffered_bytes
        while self._next < self._end and (not self._jobs or queued < self._ahead_bytes):
            span = self._span_bytes
            if self._first_span_bytes and self._next == self._first:
                span = min(span, self._first_span_bytes)
            stop = min(self._end, self._next + span)
            job = SpanJob(self._fetch, self._next, stop)
            self._jobs.append(job)
            opening = bool(self._first_span_bytes) and self._next == self._first
            self._pool.submit(job, opening=opening, cold=opening and self._cold)
            queued += stop - self._next
            self._next = stop

    def next_extent(self) -> Extent | None:
        """The next span's bytes (waiting for, or fetching, it), or ``None`` at the end."""
        if self._closed:
            return None
        if self._held is not None:  # the first span's second half: now ask for the rest
            held, self._held = self._held, None
            self._fill()
            return held
        if not self._jobs:
            return None
        job = self._jobs[0]
        data = job.result()
        self._jobs.popleft()
        if len(data) < job.end - job.start:  # the object ended early: nothing follows
            self._drop()
            return data or None
        if self._hold_rest and job.start == self._first and len(data) > 1:
            self._hold_rest = False  # once: later spans come whole
            half = len(data) // 2
            self._held = memoryview(data)[half:]
            return memoryview(data)[:half]  # (the halves share one receive buffer: see recycle)
        self._fill()
        return data or None

    def _drop(self) -> None:
        for job in self._jobs:
            job.cancel()
        self._jobs.clear()
        self._held = None

    def seek(self, offset: int) -> None:
        """Drop the spans ahead and continue from ``offset`` (spans from there come whole)."""
        self._drop()
        self._hold_rest = False
        self._stop.clear()
        self._next = self._first = min(max(0, offset), self._end)
        self._closed = False
        self._fill()

    def close(self) -> None:
        """Cancel spans not yet started; running ones finish and are dropped."""
        self._closed = True
        self._stop.set()
        self._drop()


def pool_for(options: ReadOptions) -> FetchPool:
    """This process's pool, with ``options``' bounds on requests in flight."""
    return shared_pool(options.max_requests, options.min_requests)


def span_fetch(source: Any, retrier: Retrier, gauge: LatencyGauge) -> Any:
    """``fetch(a, b)``: bytes ``[a, b)`` of ``source``, retried and resumed like any read; a
    span fetched by one GET tells ``gauge`` its first-byte and transfer times."""

    def fetch(first: int, stop: int) -> Extent:
        own = retrier.fresh()
        span = stop - first
        timed = TimedSource(source)
        started = time.monotonic()
        fetcher = ExtentFetcher(timed, stop, span, own, span, span, first, stop)
        parts = []
        while (extent := fetcher.next_extent()) is not None:
            parts.append(extent)
        if timed.num_opens == 1:  # retried spans say nothing about the store's latency
            gauge.record(timed.first_byte_s, time.monotonic() - started - timed.first_byte_s)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    return fetch
