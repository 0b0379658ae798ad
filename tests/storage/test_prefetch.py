"""The shared fetch pool, the span prefetcher and announced ranges (no network)."""

from __future__ import annotations

import io
import threading
import time
from typing import Any

import pytest

from shardstream._storage.remote.prefetch import FetchPool, PrefetchQueue, SpanJob, SpanPrefetcher

DATA = bytes(range(256)) * 400  # 102,400 bytes


class Recorder:
    """``fetch(a, b)`` over DATA that records calls, threads and the most running at once."""

    def __init__(self, delay_s: float = 0.0, fail_at: int | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self.threads: set[str] = set()
        self.delay_s, self.fail_at = delay_s, fail_at
        self.running = self.most_running = 0
        self._lock = threading.Lock()

    def __call__(self, start: int, end: int) -> bytes:
        with self._lock:
            self.calls.append((start, end))
            self.threads.add(threading.current_thread().name)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            time.sleep(self.delay_s)
            if self.fail_at is not None and start <= self.fail_at < end:
                raise OSError(f"broken span at {start}")
            return DATA[start:end]
        finally:
            with self._lock:
                self.running -= 1


def read_all(source: SpanPrefetcher) -> bytes:
    parts = []
    while (extent := source.next_extent()) is not None:
        parts.append(bytes(extent))
    return b"".join(parts)


def test_spans_come_back_in_order_and_exact() -> None:
    fetch = Recorder()
    prefetcher = SpanPrefetcher(fetch, 1000, 90_001, 7000, 30_000, FetchPool(3))
    assert read_all(prefetcher) == DATA[1000:90_001]
    assert sorted(fetch.calls)[0] == (1000, 8000) and sorted(fetch.calls)[-1][1] == 90_001
    assert prefetcher.next_extent() is None, "the end stays the end"


def test_several_spans_are_fetched_at_once_within_the_bound() -> None:
    fetch = Recorder(delay_s=0.05)
    prefetcher = SpanPrefetcher(fetch, 0, 80_000, 10_000, 40_000, FetchPool(4))
    time.sleep(0.02)
    # Submitted at construction: 4 spans (40,000 bytes) ahead, no more.
    assert prefetcher.buffered_bytes == 40_000
    assert len(fetch.calls) <= 4
    assert read_all(prefetcher) == DATA[:80_000]
    assert fetch.most_running >= 2, "GETs overlap"
    assert any(name.startswith("shardstream-fetch") for name in fetch.threads)


def test_a_caller_fetches_a_span_nobody_started() -> None:
    pool = FetchPool(1)
    blocker = threading.Event()
    pool.submit(SpanJob(lambda a, b: blocker.wait(5) and b"", 0, 0))  # keeps the thread busy
    fetch = Recorder()
    prefetcher = SpanPrefetcher(fetch, 0, 20_000, 10_000, 20_000, pool)
    started = time.monotonic()
    assert read_all(prefetcher) == DATA[:20_000]
    assert time.monotonic() - started < 2.0, "did not wait behind the busy pool thread"
    assert fetch.threads == {threading.current_thread().name}
    blocker.set()


def test_errors_reach_the_caller_at_their_span() -> None:
    prefetcher = SpanPrefetcher(Recorder(fail_at=25_000), 0, 50_000, 10_000, 50_000, FetchPool(2))
    assert bytes(prefetcher.next_extent() or b"") == DATA[:10_000]
    assert bytes(prefetcher.next_extent() or b"") == DATA[10_000:20_000]
    with pytest.raises(OSError, match="broken span at 20000"):
        prefetcher.next_extent()


def test_seek_drops_spans_ahead_and_close_cancels() -> None:
    fetch = Recorder()
    prefetcher = SpanPrefetcher(fetch, 0, 100_000, 10_000, 20_000, FetchPool(2))
    prefetcher.seek(55_000)
    assert read_all(prefetcher) == DATA[55_000:100_000]
    stop = threading.Event()
    closing = SpanPrefetcher(Recorder(delay_s=0.05), 0, 100_000, 10_000, 50_000, FetchPool(1),
                             stop)  # fmt: skip
    closing.close()
    assert stop.is_set() and closing.next_extent() is None and not closing.alive


def test_a_short_object_ends_the_stream_early() -> None:
    short = Recorder()
    prefetcher = SpanPrefetcher(lambda a, b: short(a, min(b, 25_000)), 0, 60_000, 10_000,
                                60_000, FetchPool(2))  # fmt: skip
    assert read_all(prefetcher) == DATA[:25_000]


def test_pool_threads_are_bounded_and_exit_when_idle() -> None:
    pool = FetchPool(2, idle_exit_s=0.1)
    fetch = Recorder(delay_s=0.02)
    jobs = [SpanJob(fetch, i * 10, i * 10 + 10) for i in range(10)]
    for job in jobs:
        pool.submit(job)
    assert [bytes(job.result()) for job in jobs] == [DATA[i * 10 : i * 10 + 10] for i in range(10)]
    assert fetch.most_running <= 3  # two pool threads, and this one taking a job itself
    deadline = time.monotonic() + 3
    while pool.num_threads and time.monotonic() < deadline:
        time.sleep(0.02)
    assert pool.num_threads == 0


class Opened(io.BytesIO):
    """A stream that remembers being closed."""


def opener(log: list[str], name: str) -> Any:
    def open_it() -> Opened:
        log.append(name)
        return Opened(name.encode())

    return open_it


def test_announced_ranges_open_in_order_within_the_budget() -> None:
    queue, log = PrefetchQueue(budget_bytes=250), []
    queue.hint("g", [(name, 100, opener(log, name)) for name in "abcd"])
    assert log == ["a", "b"], "a third range would pass the budget"
    assert queue.used_bytes == 200
    taken = queue.take("a")
    assert taken is not None and taken.read() == b"a"
    assert log == ["a", "b", "c"], "taking one frees room for the next"
    assert queue.take("zzz") is None
    queue.take("d")  # opened by its caller now: never opened ahead
    queue.take("b")
    queue.take("c")
    assert log == ["a", "b", "c"] and queue.used_bytes == 0


def test_new_hints_replace_a_groups_old_ones_and_forget_closes() -> None:
    queue, log = PrefetchQueue(budget_bytes=1000), []
    queue.hint("g", [("a", 100, opener(log, "a")), ("b", 100, opener(log, "b"))])
    stream_b = queue._ready["b"][2]
    queue.hint("g", [("a", 100, opener(log, "a2")), ("c", 100, opener(log, "c"))])
    assert log == ["a", "b", "c"], "a is kept, not opened twice"
    assert stream_b.closed, "b is no longer wanted"
    queue.hint("other", [("x", 100, opener(log, "x"))])
    queue.forget("g")
    assert queue.take("a") is None and queue.take("c") is None
    assert queue.take("x") is not None and queue.used_bytes == 0


def test_a_range_announced_again_by_another_group_moves_to_it() -> None:
    """The next pass's first pieces, announced as a pass ends, are taken over by the next
    pass's readers: forgetting the old group closes only what the new one did not announce."""
    queue, log = PrefetchQueue(budget_bytes=150), []
    queue.hint("ending", [("a", 100, opener(log, "a")), ("b", 100, opener(log, "b"))])
    assert log == ["a"], "b waits for room"
    stream_a = queue._ready["a"][2]
    queue.hint("next", [("a", 100, opener(log, "a2")), ("b", 100, opener(log, "b2"))])
    assert log == ["a"], "neither is opened again"
    queue.forget("ending")
    assert not stream_a.closed
    taken = queue.take("a")
    assert taken is stream_a and taken.read() == b"a"
    assert log == ["a", "b"], "b, moved to the new group, opens with the room a left"
    queue.hint("ending", [("c", 10, opener(log, "c"))])
    queue.forget("ending")
    assert queue.take("c") is None and queue.take("b") is not None


def test_one_range_larger_than_the_budget_still_opens() -> None:
    queue, log = PrefetchQueue(budget_bytes=10), []
    queue.hint("g", [("big", 1000, opener(log, "big")), ("next", 5, opener(log, "next"))])
    assert log == ["big"]
    queue.take("big")
    assert log == ["big", "next"]


def _until(done: Any, what: str) -> None:
    """Wait (at most 5 s) for ``done()``; fail naming ``what``."""
    deadline = time.monotonic() + 5.0
    while not done():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        time.sleep(0.005)


def test_cold_openings_run_alone_then_the_others_follow() -> None:
    """While a fresh process's first openings (``cold``) run or wait, the pool starts no other
    span; when the last one ends, the others run on the pool's threads."""
    pool = FetchPool(8)
    release, lock = threading.Event(), threading.Lock()
    running: list[int] = []
    seen_running: list[list[int]] = []  # the cold spans running as each other span started

    def cold(start: int, end: int) -> bytes:
        with lock:
            running.append(start)
        release.wait(5)
        with lock:
            running.remove(start)
        return DATA[start:end]

    def other(start: int, end: int) -> bytes:
        with lock:
            seen_running.append(list(running))
        return DATA[start:end]

    colds = [SpanJob(cold, n * 10, n * 10 + 10) for n in range(3)]
    others = [SpanJob(other, n * 10, n * 10 + 10) for n in range(3, 6)]
    for job in colds:
        pool.submit(job, opening=True, cold=True)
    for number, job in enumerate(others):
        pool.submit(job, opening=number % 2 == 0)
    _until(lambda: running, "a cold span to start")
    time.sleep(0.05)  # room for the pool to start another span, which it must not
    assert seen_running == [], "a span started while cold openings ran or waited"
    release.set()
    _until(lambda: all(job._state == "done" for job in others), "the others to run")
    assert seen_running == [[], [], []], "the others ran after every cold one"
    assert all(job._state == "done" for job in colds)
    assert [bytes(job.result()) for job in colds + others] == [
        DATA[n * 10 : n * 10 + 10] for n in range(6)
    ]


def test_a_held_rest_is_asked_for_once_half_the_opening_is_read() -> None:
    """``hold_rest``: the opening comes out in two halves, and nothing past it is fetched
    until the second half is asked for (a reader that takes a sample or two moves no more)."""
    fetch = Recorder()
    prefetcher = SpanPrefetcher(fetch, 0, 100_000, 40_000, 0, FetchPool(2),
                                first_span_bytes=10_000, hold_rest=True)  # fmt: skip
    assert bytes(prefetcher.next_extent() or b"") == DATA[:5000]
    time.sleep(0.05)  # room for a wrongly submitted rest to start
    assert fetch.calls == [(0, 10_000)], "the rest was asked for before it was needed"
    assert bytes(prefetcher.next_extent() or b"") == DATA[5000:10_000]
    _until(lambda: len(fetch.calls) == 2, "the rest to be asked for")
    assert fetch.calls[1] == (10_000, 50_000)
    assert read_all(prefetcher) == DATA[10_000:100_000]
    seeking = SpanPrefetcher(Recorder(), 0, 100_000, 40_000, 0, FetchPool(2),
                             first_span_bytes=10_000, hold_rest=True)  # fmt: skip
    seeking.seek(60_000)  # after a seek spans follow whole, as usual
    assert bytes(seeking.next_extent() or b"") == DATA[60_000:70_000]
    assert read_all(seeking) == DATA[70_000:100_000]
