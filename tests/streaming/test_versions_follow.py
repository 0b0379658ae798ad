"""A real 2-rank (gloo) x 2-worker job that follows a growing dataset, and its resumes.

The job reads with ``follow_versions=True`` and persistent workers. Rank 0 publishes an
append after its first batch of epoch 0 (rank 1 waits for it in that epoch): both ranks
finish epoch 0 on version 1 and move to version 2 together when epoch 1 starts (the first rank
to start it looks for the newest version, and posts it to the process group's store). Restarted
after a third version appeared, a state saved in epoch 0 finishes epoch 0 on version 1 and a
state saved in epoch 1 finishes it on version 2, each exactly as the uninterrupted job read
it; the epoch after either reads the newest, version 3.
"""

from __future__ import annotations

import collections
import json
import pathlib
import time

import pytest
import torch.distributed as dist

from shardstream.shardwriter import build_shards
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.ddp import exit_rank_cleanly, spawn_ranks
from tests.shardwriter.growth import write_day
from tests.streaming.shards import keys_of

WORLD = 2
BUILD = {"max_samples_per_shard": 3}
OPTIONS = StreamOptions(output="dict", follow_versions=True)


def _loader(root: str) -> StreamingDataLoader:
    dataset = StreamingDataset(root, seed=3, batch_size=2, decode="raw", options=OPTIONS)
    return StreamingDataLoader(dataset, num_workers=2, persistent_workers=True)


def _follow(rank: int, root: str, work: pathlib.Path, out: dict) -> None:
    """Three epochs; rank 0 appends day 2 during epoch 0 and saves a state in each epoch."""
    loader = _loader(root)
    for epoch in range(3):
        batches = []
        for batch in loader:
            batches.append(keys_of([batch]))
            if rank == 0 and epoch == 0 and len(batches) == 1:
                build_shards(write_day(work / "day2", 2, per_class=5), root, append=True,
                             **BUILD)  # fmt: skip
                (work / "appended").touch()
            while epoch == 0 and not (work / "appended").exists():  # rank 1: still in epoch 0
                time.sleep(0.01)
            if rank == 0 and epoch < 2 and len(batches) == 2:
                (work / f"state{epoch}.json").write_text(json.dumps(loader.state_dict()))
        out[f"epoch{epoch}"] = batches
        out[f"version{epoch}"] = loader.state_dict()["dataset_version"]


def _resume(root: str, work: pathlib.Path, out: dict) -> None:
    """Each saved state in a new loader: the rest of its epoch, then the next epoch."""
    for epoch in range(2):
        loader = _loader(root)
        loader.load_state_dict(json.loads((work / f"state{epoch}.json").read_text()))
        out[f"rest{epoch}"] = [keys_of([batch]) for batch in loader]
        out[f"rest{epoch}_version"] = loader.state_dict()["dataset_version"]
        out[f"after{epoch}"] = keys_of(loader)
        out[f"after{epoch}_version"] = loader.state_dict()["dataset_version"]


def _run(rank: int, root: str, store: str, work: str, phase: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        out: dict = {}
        if phase == "follow":
            _follow(rank, root, pathlib.Path(work), out)
        else:
            _resume(root, pathlib.Path(work), out)
        pathlib.Path(work, f"{phase}-{rank}.json").write_text(json.dumps(out))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


def _spawn(work: pathlib.Path, root: pathlib.Path, phase: str) -> list[dict]:
    args = (str(root), str(work / f"store-{phase}"), str(work), phase)
    spawn_ranks(_run, args=args, nprocs=WORLD, join=True)
    return [json.loads((work / f"{phase}-{rank}.json").read_text()) for rank in range(WORLD)]


def _days(keys: list[str]) -> collections.Counter:
    return collections.Counter(key.split("/")[-1].split("_")[0] for key in keys)


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ranks_follow_new_versions_at_the_same_epoch_and_resume_exactly(tmp_path) -> None:
    root = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1, per_class=12), root, **BUILD)  # 24 samples
    ranks = _spawn(tmp_path, root, "follow")
    for epoch, (version, samples) in enumerate([(1, 24), (2, 34), (2, 34)]):
        assert [rank[f"version{epoch}"] for rank in ranks] == [version] * WORLD, f"epoch {epoch}"
        keys = [key for rank in ranks for batch in rank[f"epoch{epoch}"] for key in batch]
        assert len(keys) == len(set(keys)) == samples, f"epoch {epoch}"
        assert +_days(keys) == +collections.Counter(day1=24, day2=samples - 24)
    build_shards(write_day(tmp_path / "day3", 3, per_class=2), root, append=True, **BUILD)
    resumed = _spawn(tmp_path, root, "resume")
    for rank, (ran, again) in enumerate(zip(ranks, resumed, strict=True)):
        for epoch, version in ((0, 1), (1, 2)):  # the rest of each epoch, exactly, then newest
            assert again[f"rest{epoch}"] == ran[f"epoch{epoch}"][2:], f"rank {rank}"
            assert again[f"rest{epoch}_version"] == version
            assert again[f"after{epoch}_version"] == 3
    for epoch in (0, 1):
        after = [key for rank in resumed for key in rank[f"after{epoch}"]]
        assert len(after) == len(set(after)) == 38  # version 3: every sample once
        assert _days(after)["day3"] == 4
