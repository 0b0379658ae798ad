"""The ordered background stage: order, depth, errors at their place, a clean stop."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from shardstream._storage.background import BackgroundIterator


def test_items_come_in_order_and_the_iterator_runs_on_the_thread() -> None:
    threads: set[str] = set()

    def numbers() -> Iterator[int]:
        for number in range(50):
            threads.add(threading.current_thread().name)
            yield number

    with BackgroundIterator(numbers, depth=3, name="stage-test") as items:
        assert list(items) == list(range(50))
        assert list(items) == []  # exhausted stays exhausted
    assert threads == {"stage-test"}


def test_at_most_depth_items_are_made_ahead() -> None:
    made: list[int] = []

    def numbers() -> Iterator[int]:
        for number in range(100):
            made.append(number)
            yield number

    items = BackgroundIterator(numbers, depth=2)
    try:
        time.sleep(0.3)
        # Two queued, and a third made that waits for room.
        assert len(made) == 3
        assert next(items) == 0
        time.sleep(0.3)
        assert len(made) == 4
    finally:
        items.close()


def test_an_error_is_raised_at_its_place_after_the_items_before_it() -> None:
    def numbers() -> Iterator[int]:
        yield 1
        yield 2
        raise KeyError("the third")

    items = BackgroundIterator(numbers, depth=4)
    assert next(items) == 1 and next(items) == 2
    with pytest.raises(KeyError, match="the third"):
        next(items)
    with pytest.raises(StopIteration):
        next(items)
    assert not items.running


def test_close_stops_the_thread_and_runs_the_iterators_cleanup_there() -> None:
    cleaned: list[str] = []

    def endless() -> Iterator[int]:
        try:
            number = 0
            while True:
                yield number
                number += 1
        finally:
            cleaned.append(threading.current_thread().name)

    items = BackgroundIterator(endless, depth=1, name="endless")
    assert next(items) == 0
    items.close(timeout_s=5.0)
    assert not items.running
    assert cleaned == ["endless"]
    with pytest.raises(StopIteration):
        next(items)


def test_setup_wraps_the_iteration_on_the_thread() -> None:
    local = threading.local()

    class Place:
        def __enter__(self) -> None:
            local.place = 7

        def __exit__(self, *exc: object) -> None:
            del local.place

    def places() -> Iterator[int]:
        yield local.place

    with BackgroundIterator(places, setup=Place) as items:
        assert list(items) == [7]
    assert not hasattr(local, "place")


def test_depth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="depth must be at least 1"):
        BackgroundIterator(lambda: iter(()), depth=0)
