"""ReadAhead on its own, over a fake ExtentSource: order, bounded memory, stop on close, errors.

Waits poll the object's state with generous deadlines; nothing asserts how long anything took.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from shardstream._storage.remote.ranged import ExtentFetcher, ReadAhead
from shardstream._storage.remote.retry import Retrier
from tests.storage.fakes import FakeExtents, FakeObject, Fault, random_bytes

EXTENT = 1024
MAX_BYTES = 8 * EXTENT
DEADLINE_S = 10.0


def make_extents(count: int) -> list[bytes]:
    return [random_bytes(EXTENT, seed=index) for index in range(count)]


def wait_until(predicate: Callable[[], bool], timeout_s: float = DEADLINE_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.002)
    return predicate()


def wait_idle(source: FakeExtents, settle_s: float = 0.1) -> None:
    """Return once the source has not been called for ``settle_s`` (the producer is blocked)."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        before = source.calls
        time.sleep(settle_s)
        if source.calls == before:
            return
    raise AssertionError("the read-ahead thread never stopped fetching")


@pytest.fixture
def source() -> FakeExtents:
    return FakeExtents(make_extents(200))


@pytest.fixture
def read_ahead(source: FakeExtents) -> Iterator[ReadAhead]:
    ahead = ReadAhead(source, MAX_BYTES, EXTENT, threading.Event())
    yield ahead
    ahead.close()


def test_the_first_extent_is_fetched_in_the_callers_thread(
    source: FakeExtents, read_ahead: ReadAhead
) -> None:
    callers: list[threading.Thread] = []
    source.on_call.append(lambda: callers.append(threading.current_thread()))
    assert read_ahead.next_extent() == source.extents[0]
    assert callers == [threading.current_thread()] and not read_ahead.alive
    assert read_ahead.next_extent() == source.extents[1]
    assert read_ahead.alive and callers[1] is not threading.current_thread()


def test_every_extent_arrives_once_and_in_order() -> None:
    source = FakeExtents(make_extents(50))
    ahead = ReadAhead(source, 4 * EXTENT, EXTENT, threading.Event())
    received = []
    while (extent := ahead.next_extent()) is not None:
        received.append(extent)
    assert received == source.extents
    assert ahead.next_extent() is None, "the end stays the end"
    assert wait_until(lambda: not ahead.alive), "the thread ends with the object"
    ahead.close()


def test_the_window_starts_at_one_extent_and_grows_to_max_bytes(
    source: FakeExtents, read_ahead: ReadAhead
) -> None:
    queued_at_call: list[int] = []
    source.on_call.append(lambda: queued_at_call.append(read_ahead.buffered_bytes))
    assert [read_ahead.next_extent() for _ in range(2)] == source.extents[:2]
    assert wait_until(lambda: read_ahead.buffered_bytes > 0), "the thread prefetches"
    wait_idle(source)
    assert read_ahead.buffered_bytes <= 2 * EXTENT, "a short read prefetches little"
    consumed = 2 + 20
    assert [read_ahead.next_extent() for _ in range(20)] == source.extents[2:consumed]
    assert wait_until(lambda: read_ahead.buffered_bytes >= MAX_BYTES), "the window grew"
    wait_idle(source)
    assert read_ahead.buffered_bytes == MAX_BYTES
    assert source.calls == consumed + MAX_BYTES // EXTENT, "nothing fetched past the bound"
    assert max(queued_at_call) + EXTENT <= MAX_BYTES, "a fetch never starts without room"


def test_close_stops_the_thread_and_closes_the_source(
    source: FakeExtents, read_ahead: ReadAhead
) -> None:
    producers: list[threading.Thread] = []
    source.on_call.append(lambda: producers.append(threading.current_thread()))
    for index in range(3):
        assert read_ahead.next_extent() == source.extents[index]
    assert wait_until(lambda: read_ahead.buffered_bytes > 0)
    producer = producers[-1]
    assert producer is not threading.current_thread() and producer.is_alive()
    read_ahead.close()
    assert not read_ahead.alive and not producer.is_alive()
    assert source.closed and read_ahead.buffered_bytes == 0
    calls = source.calls
    time.sleep(0.05)
    assert source.calls == calls and source.calls_after_close == 0


def test_close_interrupts_a_retry_backoff() -> None:
    # A real fetcher whose retrier sleeps 15-30 s after a reset at the fourth extent.
    source = FakeObject(random_bytes(20 * EXTENT), [Fault(3 * EXTENT, "reset", times=100)])
    retrier = Retrier("s3://bucket/k", "reading", 100, backoff_s=30.0, max_backoff_s=30.0)
    fetcher = ExtentFetcher(source, 20 * EXTENT, EXTENT, retrier, EXTENT, EXTENT)
    ahead = ReadAhead(fetcher, MAX_BYTES, EXTENT, retrier.stop)
    assert ahead.next_extent() == source.data[:EXTENT]
    assert ahead.next_extent() == source.data[EXTENT : 2 * EXTENT]
    assert wait_until(lambda: retrier.total_failures >= 1), "the thread reached the fault"
    started = time.monotonic()
    ahead.close()
    assert not ahead.alive, "the thread was still sleeping out its backoff"
    assert time.monotonic() - started < 4.0  # hang guard: close joins for at most 5 s
    assert source.open_bodies == 0


def test_an_error_in_the_source_reaches_the_reader_after_the_extents_before_it() -> None:
    error = RuntimeError("boom at extent 5")
    source = FakeExtents(make_extents(10), fail_at=5, error=error)
    ahead = ReadAhead(source, MAX_BYTES, EXTENT, threading.Event())
    assert [ahead.next_extent() for _ in range(5)] == source.extents[:5]
    with pytest.raises(RuntimeError) as caught:
        ahead.next_extent()
    assert caught.value is error
    with pytest.raises(RuntimeError):
        ahead.next_extent()  # never mistaken for a clean end of the object later
    ahead.close()
    assert not ahead.alive


def test_an_error_on_the_first_extent_is_raised_directly() -> None:
    error = ConnectionResetError("reset")
    ahead = ReadAhead(FakeExtents(make_extents(3), 0, error), MAX_BYTES, EXTENT, threading.Event())
    with pytest.raises(ConnectionResetError) as caught:
        ahead.next_extent()
    assert caught.value is error and not ahead.alive
    ahead.close()


def test_seek_drops_what_was_prefetched_and_starts_small_again(
    source: FakeExtents, read_ahead: ReadAhead
) -> None:
    for index in range(10):
        assert read_ahead.next_extent() == source.extents[index]
    assert wait_until(lambda: read_ahead.buffered_bytes > 0)
    read_ahead.seek(40 * EXTENT)
    assert source.seeks == [40 * EXTENT] and read_ahead.buffered_bytes == 0
    assert not read_ahead.alive and read_ahead.window_bytes == EXTENT
    assert read_ahead.next_extent() == source.extents[40] and not read_ahead.alive
    rest = []
    while (extent := read_ahead.next_extent()) is not None:
        rest.append(extent)
    assert rest == source.extents[41:]
    read_ahead.seek(0)  # after the end, a seek back reads again
    assert [read_ahead.next_extent() for _ in range(3)] == source.extents[:3]
