"""Real 2-rank (gloo) jobs on a dataset that grows while the ranks start: one version for all.

The race is made deterministic: the rank that makes its dataset first signals once it has
opened the dataset (a wrapper around the real ``open_version``), and only then does the other
rank publish an append and make its own. Every trial is such a race, rank 0 first in even
trials and second in odd ones; every rank must read the version rank 0 opened.
"""

from __future__ import annotations

import contextlib
import json
import pathlib
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from shardstream.catalog.versions import prune_versions
from shardstream.errors import ConfigError
from shardstream.shardwriter import build_shards
from shardstream.storage import Store
from shardstream.streaming import StreamingDataset, StreamOptions
from shardstream.streaming import dataset as dataset_module
from tests.ddp import exit_rank_cleanly
from tests.shardwriter.growth import write_day
from tests.streaming.shards import keys_of

WORLD = 2
TRIALS = 100
BUILD = {"max_samples_per_shard": 3}


@contextlib.contextmanager
def _signal_when_opened(marker: pathlib.Path) -> Iterator[None]:
    """Touch ``marker`` as soon as this process's next dataset has opened its version."""
    real = dataset_module.open_version

    def opened_then_signal(*args, **kwargs):  # type: ignore[no-untyped-def]
        version = real(*args, **kwargs)
        marker.touch()
        return version

    dataset_module.open_version = opened_then_signal
    try:
        yield
    finally:
        dataset_module.open_version = real


def _wait_for(marker: pathlib.Path) -> None:
    while not marker.exists():
        time.sleep(0.001)


def _make(root: str) -> StreamingDataset:
    return StreamingDataset(root, seed=1, decode="raw", options=StreamOptions(output="dict"))


def _race(rank: int, trial: int, root: str, work: pathlib.Path, prune: bool) -> StreamingDataset:
    """Make the dataset; the second rank to make it first publishes an append (and prunes)."""
    marker = work / f"opened-{trial}"
    if rank == trial % WORLD:
        with _signal_when_opened(marker):
            return _make(root)
    _wait_for(marker)
    build_shards(write_day(work / f"day{trial + 2}", trial + 2, per_class=1), root,
                 append=True, **BUILD)  # fmt: skip
    if prune:
        prune_versions(Store(root), keep=1)
    return _make(root)


def _run(rank: int, root: str, store: str, work: str, trials: int, mode: str) -> None:
    """``mode``: "race", "prune" (rank 1 prunes what rank 0 opened), or "late" (the datasets
    are made before the process group exists, and settle at ``set_epoch``)."""
    if mode != "late":
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        results = []
        for trial in range(trials):
            try:
                dataset = _race(rank, trial, root, pathlib.Path(work), mode == "prune")
                if mode == "late":
                    dist.init_process_group(
                        "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD
                    )
                    dataset.set_epoch(0)
                results.append({"version": dataset.version, "len": len(dataset),
                                "keys": keys_of(dataset)})  # fmt: skip
            except ConfigError as error:
                results.append({"error": str(error)})
            dist.barrier()
        pathlib.Path(work, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


def _spawn(tmp_path: pathlib.Path, trials: int, mode: str = "race") -> list[list[dict]]:
    root = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1, per_class=3), root, **BUILD)  # 6 samples
    args = (str(root), str(tmp_path / "store"), str(tmp_path), trials, mode)
    mp.spawn(_run, args=args, nprocs=WORLD, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ranks_read_the_version_rank_0_opened_in_every_race(tmp_path: pathlib.Path) -> None:
    ranks = _spawn(tmp_path, TRIALS)
    for trial, (zero, one) in enumerate(zip(*ranks, strict=True)):
        # Before the trial's append the newest is trial + 1, after it trial + 2; rank 0 opens
        # first in even trials, second in odd ones: every rank reads what rank 0 opened.
        version = trial + 1 if trial % 2 == 0 else trial + 2
        assert zero["version"] == one["version"] == version, f"trial {trial}"
        assert zero["len"] == one["len"] == 2 + version  # 6 + 2 * (version - 1) samples
        keys = zero["keys"] + one["keys"]
        days = {int(key.split("/")[-1][3:].split("_")[0]) for key in keys}
        assert len(keys) == len(set(keys)) == 4 + 2 * version, f"trial {trial}"
        assert days == set(range(1, version + 1)), f"trial {trial}"


@pytest.mark.slow
def test_ranks_stop_together_when_rank_0s_version_was_pruned(tmp_path: pathlib.Path) -> None:
    (first,), (second,) = _spawn(tmp_path, 1, "prune")
    for result in (first, second):  # rank 0 opened version 1; rank 1 only finds version 2
        assert "rank 0: version 1, rank 1: version 2" in result["error"]
        assert "not every rank can read version 1" in result["error"]


@pytest.mark.slow
def test_ranks_settle_at_set_epoch_when_the_process_group_came_later(tmp_path) -> None:
    (zero,), (one,) = _spawn(tmp_path, 1, "late")  # rank 0 opened version 1, rank 1 version 2
    assert zero["version"] == one["version"] == 1 and zero["len"] == one["len"] == 3
    keys = zero["keys"] + one["keys"]
    assert len(keys) == len(set(keys)) == 6 and not any("day2" in key for key in keys)
