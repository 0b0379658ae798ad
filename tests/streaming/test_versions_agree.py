"""Real 2-rank (gloo) jobs on a dataset that grows while the ranks start: one version for all.

The race is made deterministic: the rank that makes its dataset first signals once it has
made it, and only then does the other rank publish an append and make its own (which opens the
newer version, and must move back). Every trial is such a race, rank 0 first in even
trials and second in odd ones; every rank must read the version the first rank opened (it
posts it to the process group's store; nobody waits for anybody).
"""

from __future__ import annotations

import json
import pathlib
import time

import pytest
import torch.distributed as dist

from shardstream._catalog.versions import prune_versions
from shardstream._storage import Store
from shardstream.errors import ConfigError
from shardstream.shardwriter import build_shards
from shardstream.streaming import StreamingDataset, StreamOptions
from tests.ddp import exit_rank_cleanly, spawn_ranks
from tests.shardwriter.growth import write_day
from tests.streaming.shards import keys_of

WORLD = 2
TRIALS = 100
BUILD = {"max_samples_per_shard": 3}


def _wait_for(marker: pathlib.Path) -> None:
    while not marker.exists():
        time.sleep(0.001)


def _make(root: str) -> StreamingDataset:
    return StreamingDataset(root, seed=1, decode="raw", options=StreamOptions(output="dict"))


def _race(rank: int, trial: int, root: str, work: pathlib.Path, prune: bool) -> StreamingDataset:
    """Make the dataset; the second rank to make it first publishes an append (and prunes)."""
    marker = work / f"made-{trial}"
    if rank == trial % WORLD:
        made = _make(root)
        marker.touch()
        return made
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
    spawn_ranks(_run, args=args, nprocs=WORLD, join=True)
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ranks_read_the_version_rank_0_opened_in_every_race(tmp_path: pathlib.Path) -> None:
    ranks = _spawn(tmp_path, TRIALS)
    for trial, (zero, one) in enumerate(zip(*ranks, strict=True)):
        # Before the trial's append the newest is trial + 1, after it trial + 2; rank 0 opens
        # first in even trials, second in odd ones: every rank reads what the first opened.
        version = trial + 1
        assert zero["version"] == one["version"] == version, f"trial {trial}"
        assert zero["len"] == one["len"] == 2 + version  # 6 + 2 * (version - 1) samples
        keys = zero["keys"] + one["keys"]
        days = {int(key.split("/")[-1][3:].split("_")[0]) for key in keys}
        assert len(keys) == len(set(keys)) == 4 + 2 * version, f"trial {trial}"
        assert days == set(range(1, version + 1)), f"trial {trial}"


@pytest.mark.slow
def test_a_rank_stops_when_the_first_ranks_version_was_pruned(tmp_path: pathlib.Path) -> None:
    (first,), (second,) = _spawn(tmp_path, 1, "prune")
    # Rank 0 opened version 1 first; rank 1 only finds version 2, and stops rather than read
    # another version than rank 0 (which reads what it opened).
    assert first["version"] == 1 and first["len"] == 3
    assert "rank 1 opened version 2" in second["error"]
    assert "first rank to make this dataset opened version 1" in second["error"]
    assert "cannot read" in second["error"] and "version=N on every rank" in second["error"]


@pytest.mark.slow
def test_ranks_settle_at_set_epoch_when_the_process_group_came_later(tmp_path) -> None:
    (zero,), (one,) = _spawn(tmp_path, 1, "late")  # rank 0 opened version 1, rank 1 version 2
    # Both settle at set_epoch, in either order: the first to get there decides.
    version = zero["version"]
    assert version == one["version"] in (1, 2) and zero["len"] == one["len"] == 2 + version
    keys = zero["keys"] + one["keys"]
    assert len(keys) == len(set(keys)) == 4 + 2 * version
    assert any("day2" in key for key in keys) == (version == 2)
