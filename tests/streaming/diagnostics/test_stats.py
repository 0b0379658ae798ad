"""Loader statistics and `shardstream bench`: stage times add up to the wall time, and slow
storage, a slow transform and a slow consumer are each named as the bottleneck."""

from __future__ import annotations

import json
import logging
import pathlib
import time
from typing import Any

import pytest
import torch

from shardstream import ConfigError, StreamingDataLoader, StreamingDataset, StreamOptions
from shardstream._cli import main
from shardstream._storage import Store
from shardstream.streaming._diagnostics.bench import BenchOptions, run_bench
from shardstream.streaming._diagnostics.stats import LoaderStats
from tests.streaming.shards import make_dataset

DELAY = 0.004  # seconds per sample in the slow part


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    folder, _ = make_dataset(tmp_path_factory.mktemp("stats"), num_samples=240, per_shard=40)
    return folder


def _slow_transform(image: Any) -> Any:
    time.sleep(DELAY)
    return image


def _loader(root: pathlib.Path, workers: int, **kwargs: Any) -> StreamingDataLoader:
    options = StreamOptions(stats=True, memory_map=False, **kwargs.pop("options", {}))
    ds = StreamingDataset(root, batch_size=8, decode="pil", options=options, **kwargs)
    return StreamingDataLoader(ds, num_workers=workers, persistent_workers=workers > 0)


@pytest.fixture
def slow_storage(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read from a shard file waits: a high-latency store, in the reader's own I/O.
    Forked DataLoader workers inherit the patch."""
    real = Store.open_read

    def open_read(self: Store, *args: Any, **kwargs: Any) -> Any:
        return _SlowStream(real(self, *args, **kwargs))

    monkeypatch.setattr(Store, "open_read", open_read)


class _SlowStream:
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __enter__(self) -> _SlowStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()

    def read(self, size: int = -1) -> bytes:
        time.sleep(DELAY / 4)
        return self._stream.read(size)

    def readinto(self, buffer: Any) -> int:
        time.sleep(DELAY / 4)
        return self._stream.readinto(buffer)


def test_without_workers_the_stages_add_up_to_the_waits(root: pathlib.Path) -> None:
    loader = _loader(root, 0, transform=_slow_transform)
    keys = [len(batch[1]) for batch in loader]
    stats = loader.stats()
    assert stats["samples"] == sum(keys) == 240 == stats["read_samples"]
    worked = sum(stats["stages_s"].values())
    # In-process, the loop waits exactly while the reader works (plus the small glue).
    assert 0.85 * stats["wait_s"] <= worked <= stats["wait_s"]
    assert stats["wait_s"] + stats["step_s"] == pytest.approx(stats["wall_s"], rel=0.05)
    assert stats["stages_s"]["transform"] >= 240 * DELAY
    assert stats["bottleneck"] == "transform" and stats["workers"][0]["worker"] is None
    assert stats["bytes"] > 240 * 300


def test_slow_storage_is_named_and_worker_time_fills_the_wall(
    root: pathlib.Path, slow_storage: None
) -> None:
    loader = _loader(root, 2)
    for _ in range(2):  # persistent workers: two passes, each summarised
        assert sum(len(batch[1]) for batch in loader) == 240
    stats = loader.stats()
    assert [p["samples"] for p in stats["passes"]] == [240, 240]
    assert stats["bottleneck"] == "storage" == stats["passes"][1]["bottleneck"]
    second = stats["passes"][1]
    busy = sum(second["stages_s"].values())
    # Data-bound: both workers are busy most of the time the loop runs (the pass lasts about
    # 0.15 s, so its start and end, where one worker is idle, weigh more on a loaded machine).
    assert 0.5 * 2 * second["wall_s"] <= busy <= 2 * second["wall_s"] * 1.05
    assert [w["worker"] for w in stats["workers"]] == [0, 1]
    assert sum(w["samples"] for w in stats["workers"]) == 480


def test_a_slow_consumer_is_named_and_logged(
    root: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    loader = _loader(root, 2, options={"stats_interval_s": 0.05})
    with caplog.at_level(logging.INFO, logger="shardstream.stats"):
        for _ in loader:
            time.sleep(8 * DELAY * 2)  # a training step slower than reading a batch
    stats = loader.stats()
    assert stats["bottleneck"] == "consumer" and stats["stall_share"] < 0.1
    assert stats["step_s"] > 0.9 * 30 * 8 * DELAY * 2
    assert "bottleneck: consumer" in caplog.text


def test_a_plain_dataloader_is_watched_and_off_means_off(root: pathlib.Path) -> None:
    ds = StreamingDataset(root, batch_size=8, options=StreamOptions(stats=True))
    stats = LoaderStats(ds)
    loader = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2)
    assert sum(len(batch[1]) for batch in stats.watch(loader)) == 240
    assert stats.snapshot()["read_samples"] == 240 and stats.snapshot()["batches"] == 30
    off = StreamingDataLoader(StreamingDataset(root, batch_size=8))
    with pytest.raises(ConfigError, match="stats=True"):
        off.stats()


def test_bench_names_each_bottleneck(root: pathlib.Path, slow_storage: None) -> None:
    quick = BenchOptions(workers=2, batch_size=8, mode="raw", seconds=None, warmup_batches=1)
    storage = run_bench(root, quick, stream_options=StreamOptions(memory_map=False))
    assert storage["bottleneck"] == "storage" and storage["samples"] > 0
    assert any("read_ahead_bytes" in line for line in storage["advice"])
    train = BenchOptions(workers=2, batch_size=8, mode="train", seconds=None, warmup_batches=1)
    slow = run_bench(root, train, transform=_slow_transform)
    assert slow["bottleneck"] == "transform"
    waiting = run_bench(root, train, transform=lambda image: image,
                        consumer=lambda batch: time.sleep(0.1))  # fmt: skip
    assert waiting["bottleneck"] == "consumer"


def test_bench_command_prints_a_table_and_json(
    root: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", str(root), "--mode", "raw", "--batch-size", "8", "--workers", "0",
                 "--batches", "5"]) == 0  # fmt: skip
    out = capsys.readouterr().out
    assert "| samples/s" in out and "bottleneck" in out
    assert main(["bench", str(root), "--mode", "raw", "--batch-size", "8", "--workers", "0",
                 "--batches", "5", "--json"]) == 0  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["batches"] == 5 and report["samples"] == 40 and report["advice"]
