"""Receive buffers: reused only when nothing else can see them, never changing held bytes."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from shardstream._storage.background import ProcessLocal
from shardstream._storage.remote import buffers
from shardstream._storage.remote.buffers import MIN_POOLED_BYTES, ReceiveBuffers, recycle
from shardstream._storage.remote.ranged import RemoteStream

SIZE = 2 * MIN_POOLED_BYTES


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> ReceiveBuffers:
    fresh = ReceiveBuffers(max_bytes=8 * SIZE)
    monkeypatch.setattr(buffers, "RECEIVE_BUFFERS", ProcessLocal(lambda: fresh))
    return fresh


def pooled_extent(pool: ReceiveBuffers, data: bytes) -> memoryview:
    buffer = pool.take(len(data))
    buffer[: len(data)] = data
    return memoryview(buffer)[: len(data)]


class Holder:
    def __init__(self, extent: Any) -> None:
        self.extent = extent

    def take(self) -> Any:
        extent, self.extent = self.extent, None
        return extent


def test_a_extent_nobody_else_sees_is_reused(pool: ReceiveBuffers) -> None:
    holder = Holder(pooled_extent(pool, b"a" * SIZE))
    recycle(holder.take())
    assert pool.kept_bytes >= SIZE
    again = pool.take(SIZE)
    assert pool.reused == 1 and len(again) >= SIZE


@pytest.mark.parametrize("kept", ["slice", "other view", "numpy array"])
def test_a_extent_seen_elsewhere_is_left_alone(pool: ReceiveBuffers, kept: str) -> None:
    data = os.urandom(SIZE)
    extent = pooled_extent(pool, data)
    if kept == "slice":
        held: Any = extent[10:]
    elif kept == "other view":
        held = memoryview(extent.obj)
    else:
        held = np.frombuffer(extent, np.uint8)
    holder = Holder(extent)
    del extent
    recycle(holder.take())
    assert pool.kept_bytes == 0
    # Taking and filling buffers now must not touch what is held.
    for _ in range(3):
        pooled_extent(pool, b"\xff" * SIZE)
    expected = data[10:] if kept == "slice" else data
    assert bytes(held[: len(expected)]) == expected


def test_a_extent_given_back_but_kept_fails_on_use_and_never_shows_other_bytes(
    pool: ReceiveBuffers,
) -> None:
    extent = pooled_extent(pool, os.urandom(SIZE))
    recycle(extent)  # against the rule: the caller still holds it
    pooled_extent(pool, b"\xff" * SIZE)  # its buffer is reused...
    with pytest.raises(ValueError, match="released"):
        bytes(extent[:10])  # ...and the stale view cannot read it


def test_bytes_and_small_buffers_are_not_pooled(pool: ReceiveBuffers) -> None:
    recycle(Holder(b"x" * SIZE).take())
    recycle(Holder(memoryview(bytearray(100))).take())
    assert pool.kept_bytes == 0


def test_the_pool_is_bounded(pool: ReceiveBuffers) -> None:
    for _ in range(20):
        pool.give(bytearray(SIZE))
    assert pool.kept_bytes <= pool.max_bytes


class Extents:
    """An extent source handing out pooled views, like the S3 read path."""

    def __init__(self, pool: ReceiveBuffers, data: bytes, size: int) -> None:
        self.pool, self.pieces = pool, [data[i : i + size] for i in range(0, len(data), size)]

    def next_extent(self) -> Any:
        return pooled_extent(self.pool, self.pieces.pop(0)) if self.pieces else None

    def seek(self, offset: int) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        """Nothing to release."""


def test_a_stream_gives_read_extents_back_and_its_bytes_stay_right(pool: ReceiveBuffers) -> None:
    data = os.urandom(6 * SIZE + 123)
    stream = RemoteStream(Extents(pool, data, SIZE), "s3://b/x.tar", len(data))
    out = bytearray()
    while piece := stream.read(300_001):
        out += piece
    stream.close()
    assert bytes(out) == data
    assert pool.reused >= 4, "each extent's buffer served a later one"
