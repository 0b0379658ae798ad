"""How many GETs go in flight: the latency gauge and the fetch pool that follows it."""

from __future__ import annotations

import pytest

from shardstream._storage.remote.prefetch import FetchPool, LatencyGauge, SpanJob, TimedSource
from tests.storage.test_prefetch import Recorder


def test_the_gauge_asks_for_requests_by_littles_law_within_bounds() -> None:
    gauge = LatencyGauge()
    assert gauge.requests_in_flight(fewest=4, most=64) == 4, "nothing measured: the fewest"
    gauge.record(first_byte_s=0.030, transfer_s=0.010)
    assert gauge.requests_in_flight(4, 64) == 16, "the first GET counts fully: 4 * (1 + 3)"
    for _ in range(100):
        gauge.record(first_byte_s=0.002, transfer_s=0.010)
    assert gauge.requests_in_flight(4, 64) == 5, "a fast store: 4 * 1.2, rounded up"
    for _ in range(100):
        gauge.record(first_byte_s=0.100, transfer_s=0.0)  # a tiny range: no transfer time
    assert gauge.requests_in_flight(4, 64) == 64, "latency-bound: the most"
    assert gauge.requests_in_flight(4, 2) == 4, "the fewest wins a contradiction"
    assert gauge.first_byte_s == pytest.approx(0.100, rel=0.01)


def test_the_pool_grows_as_measured_latency_rises_and_never_past_the_most() -> None:
    fast, slow = FetchPool(8, min_threads=2), FetchPool(8, min_threads=2)
    for _ in range(20):
        slow.gauge.record(first_byte_s=0.030, transfer_s=0.005)
    runs = {}
    for name, pool in (("fast", fast), ("slow", slow)):
        recorder = Recorder(delay_s=0.02)
        jobs = [SpanJob(recorder, n * 100, (n + 1) * 100) for n in range(40)]
        for job in jobs:
            pool.submit(job)
        assert [bytes(job.result()) for job in jobs] == [recorder(j.start, j.end) for j in jobs]
        runs[name] = recorder.most_running
    # The caller runs a job itself when no thread has started it yet (at most one at a time).
    assert runs["fast"] in (2, 3)
    assert runs["slow"] in (8, 9)


def test_a_pool_raises_its_count_while_jobs_wait() -> None:
    pool = FetchPool(6, min_threads=1)
    recorder = Recorder(delay_s=0.02)
    jobs = [SpanJob(recorder, n * 100, (n + 1) * 100) for n in range(30)]
    for job in jobs:  # all queued while nothing is measured yet: one thread
        pool.submit(job)
    for _ in range(10):
        pool.gauge.record(first_byte_s=0.050, transfer_s=0.010)
    for job in jobs:
        job.result()
    assert recorder.most_running > 1, "threads were added for the queued jobs as latency rose"
    assert recorder.most_running <= 6 + 1, "six threads, and the caller running one itself"


class _Source:
    total_size = 1234

    def open_body(self, offset: int, end: int) -> tuple[int, int]:
        return offset, end


def test_timed_source_counts_opens_and_passes_the_size_through() -> None:
    timed = TimedSource(_Source())
    assert timed.open_body(5, 10) == (5, 10)
    assert timed.num_opens == 1 and timed.first_byte_s >= 0 and timed.total_size == 1234


def test_opening_spans_run_before_queued_rest_spans() -> None:
    import threading

    pool = FetchPool(1, min_threads=1)
    gate, order = threading.Event(), []

    def fetch(start: int, end: int) -> bytes:
        if start == 0:
            gate.wait(5)  # holds the only thread while the others queue
        order.append(start)
        return bytes(end - start)

    blocker = SpanJob(fetch, 0, 1)
    pool.submit(blocker)
    while blocker._state != "running":
        threading.Event().wait(0.001)
    rest = [SpanJob(fetch, n, n + 1) for n in (10, 20)]
    opening = SpanJob(fetch, 30, 31)
    for job in rest:
        pool.submit(job)
    pool.submit(opening, opening=True)
    gate.set()
    for job in [opening, *rest]:
        job._done.wait(5)
    assert order == [0, 30, 10, 20], "the opening span jumped the queue; the rest kept order"


def test_the_submitter_starts_one_thread_and_pool_threads_start_the_rest() -> None:
    import threading

    pool = FetchPool(8, min_threads=8)
    caller = threading.get_ident()
    started_by_caller: list[int] = []
    real_start = pool._start

    def start(count: int) -> None:
        if threading.get_ident() == caller:
            started_by_caller.append(count)
        real_start(count)

    pool._start = start  # type: ignore[method-assign]
    recorder = Recorder(delay_s=0.05)
    jobs = [SpanJob(recorder, n * 100, (n + 1) * 100) for n in range(8)]
    for job in jobs:
        pool.submit(job)
    for job in jobs:
        job._done.wait(5)
    assert sum(started_by_caller) == 1, "a thread start waits for the thread: not the reader's"
    assert recorder.most_running >= 6, "yet the jobs ran side by side, as eight were asked for"
