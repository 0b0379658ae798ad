"""A process that outlives its pass (the training process, persistent workers) announces the
next epoch's first pieces as the pass ends; the next pass takes them over."""

from __future__ import annotations

import pathlib
from typing import Any

import pytest

from shardstream._storage import ReadOptions
from shardstream._storage.remote import prefetch as hints
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.stores.conftest import StoreUnderTest
from tests.streaming.shards import make_dataset

FAST = ReadOptions(max_attempts=5, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5.0)


def _dataset(store: StoreUnderTest, tmp_path: pathlib.Path) -> StreamingDataset:
    folder, _ = make_dataset(tmp_path, 240, 30, num_classes=6)
    url = store.put(folder, f"next-{tmp_path.name}")
    options = StreamOptions(output="dict", storage_options=store.options, read_options=FAST,
                            piece_size=8, chunk_size=16)  # fmt: skip
    return StreamingDataset(url, decode="raw", batch_size=8, seed=5, options=options)


def _keys(loader: Any) -> list[str]:
    return [key for batch in loader for key in batch["__key__"]]


def test_the_next_epochs_first_pieces_are_fetched_and_taken_over(
    http_store: StoreUnderTest, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dataset = _dataset(http_store, tmp_path)
    queue = hints.process_queue(0)
    loader = StreamingDataLoader(dataset, num_workers=0)  # this process reads every pass
    first = _keys(loader)
    ahead = set(queue._ready) | set(queue._pending)
    assert ahead, "the ending pass announced the next one's first pieces"
    taken = []
    real_take = queue.take

    def take(key: Any) -> Any:
        stream = real_take(key)
        taken.append((key, stream is not None))
        return stream

    monkeypatch.setattr(queue, "take", take)
    second = _keys(loader)
    assert ahead <= {key for key, hit in taken if hit}, "each was handed over, not fetched again"
    assert sorted(second) == sorted(first) and second != first


def test_only_a_loader_whose_processes_outlive_the_pass_announces_it(
    http_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    dataset = _dataset(http_store, tmp_path)
    channel = dataset.control.inputs.channel
    plain = StreamingDataLoader(dataset, num_workers=2)
    reference = [_keys(plain) for _ in range(3)]
    assert not channel.ahead, "workers that exit after each epoch would waste the fetch"
    assert len({tuple(keys) for keys in reference}) == 3
    dataset.set_epoch(0)
    persistent = StreamingDataLoader(dataset, num_workers=2, persistent_workers=True)
    assert [_keys(persistent) for _ in range(3)] == reference, "the same epochs, exactly"
    assert channel.ahead
