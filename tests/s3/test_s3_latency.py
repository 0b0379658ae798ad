"""Requests in flight follow the store's first-byte latency, within the configured bounds."""

from __future__ import annotations

from typing import Any

import pytest

from shardstream._storage import ReadOptions, Store
from shardstream._storage.background import ProcessLocal
from shardstream._storage.remote import prefetch
from shardstream._storage.remote import prefetch as hints
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET, payload

NAME = "shard-000000.tar"
PIECE = 128 * 2**10
NUM_PIECES = 48


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """This test's own fetch pool and prefetch queue (they are per process, and learn)."""
    monkeypatch.setattr(prefetch, "_pool", ProcessLocal(lambda: prefetch.FetchPool(1)))
    monkeypatch.setattr(hints, "_queue", ProcessLocal(lambda: hints.PrefetchQueue(0)))


def read_announced_pieces(options: dict[str, Any], read_options: ReadOptions) -> list[bytes]:
    """Announce every piece of the shard, then read them in order (as a streaming worker)."""
    store = Store(f"s3://{BUCKET}/data", options, read_options)
    ranges = [(NAME, n * PIECE, (n + 1) * PIECE) for n in range(NUM_PIECES)]
    group = object()
    store.prefetch(ranges, group)
    pieces = []
    for _, start, end in ranges:
        with store.open_read(NAME, start, end) as stream:
            pieces.append(stream.read())
    hints.forget(group)
    return pieces


@pytest.mark.usefixtures("fresh_pool")
@pytest.mark.parametrize(("fewest", "most"), [(2, 12), (3, 3)], ids=["adaptive", "fixed"])
def test_requests_in_flight_rise_with_first_byte_latency_up_to_the_bound(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy, fewest: int, most: int
) -> None:
    blob = payload(NUM_PIECES * PIECE, seed=5)
    moto_fs.pipe(f"s3://{BUCKET}/data/{NAME}", blob)
    fault_proxy.delay_s = 0.05
    read_options = ReadOptions(
        min_requests=fewest, max_requests=most, prefetch_bytes=NUM_PIECES * PIECE
    )
    pieces = read_announced_pieces(proxy_options, read_options)
    assert b"".join(pieces) == blob
    pool = prefetch.shared_pool(1)
    assert pool.gauge.num_measured > 0 and pool.gauge.first_byte_s >= 0.05
    # The caller may send one GET of its own beside the pool's (a piece nobody started yet).
    assert fault_proxy.max_in_flight <= most + 1
    if fewest < most:
        assert pool.wanted_threads == most, "a 50 ms first byte calls for the most requests"
        assert fault_proxy.max_in_flight > fewest + 1
