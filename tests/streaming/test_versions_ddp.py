"""A real 2-rank (gloo) x 2-worker job restarted after the dataset grew under it."""

from __future__ import annotations

import collections
import itertools
import json
import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardstream.catalog.versions import read_version
from shardstream.format.manifest import read_manifest
from shardstream.shardwriter import build_shards
from shardstream.storage import Store
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.ddp import exit_rank_cleanly
from tests.shardwriter.growth import write_day
from tests.streaming.shards import keys_of

WORLD = 2
BUILD = {"max_samples_per_shard": 3}


def _loader(root: str) -> StreamingDataLoader:
    dataset = StreamingDataset(
        root, seed=2, batch_size=2, decode="raw", options=StreamOptions(output="dict")
    )
    return StreamingDataLoader(dataset, num_workers=2)


def _run(rank: int, root: str, store: str, out: str, phase: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        loader, result = _loader(root), {}
        if phase == "before":  # 2 batches per rank, then rank 0 saves the (shared) state
            result["consumed"] = keys_of(itertools.islice(loader, 2))
            if rank == 0:
                pathlib.Path(out, "state.json").write_text(json.dumps(loader.state_dict()))
        else:  # restarted on the grown dataset: the rest of the epoch, then the next one
            loader.load_state_dict(json.loads(pathlib.Path(out, "state.json").read_text()))
            for name in ("rest", "next"):
                result[name] = keys_of(loader)
                count = torch.tensor([len(result[name])])
                dist.all_reduce(count, op=dist.ReduceOp.MAX)
                result[f"{name}_max"] = int(count)
        pathlib.Path(out, f"{phase}-{rank}.json").write_text(json.dumps(result))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


def _spawn(tmp_path: pathlib.Path, root: pathlib.Path, phase: str) -> list[dict]:
    store = tmp_path / f"store-{phase}"
    mp.spawn(_run, args=(str(root), str(store), str(tmp_path), phase), nprocs=WORLD, join=True)
    return [json.loads((tmp_path / f"{phase}-{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.slow
def test_ranks_finish_the_old_version_then_read_the_new_one(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1, per_class=12), root, **BUILD)  # 24 samples
    before = _spawn(tmp_path, root, "before")
    build_shards(write_day(tmp_path / "day2", 2, per_class=5), root, append=True, **BUILD)
    after = _spawn(tmp_path, root, "after")
    old = {sample.name for sample in read_version(Store(str(root)), 1).shards}
    assert len(old) == 8 and read_manifest(str(root)).num_samples == 34
    rest_counts = {len(result["rest"]) for result in after}
    assert rest_counts == {after[0]["rest_max"]} == {8}  # equal: (24 - 2 * 4) / 2 per rank
    epoch = collections.Counter(
        key for b, a in zip(before, after, strict=True) for key in b["consumed"] + a["rest"]
    )
    assert len(epoch) == 24 and set(epoch.values()) == {1}  # version 1, every sample once
    assert not any("day2" in key for key in epoch)
    next_counts = {len(result["next"]) for result in after}
    assert next_counts == {after[0]["next_max"]} == {17}  # version 2: 34 samples, 17 per rank
    following = collections.Counter(key for result in after for key in result["next"])
    assert len(following) == 34 and sum("day2" in key for key in following) == 10
