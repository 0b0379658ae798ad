"""A real 2-rank (gloo) x 2-worker job restarted after samples were excluded under it: the
interrupted epoch ends on the version it began with, the next epoch reads each kept sample
once and no excluded one, equal on both ranks."""

from __future__ import annotations

import collections
import itertools
import json
import pathlib

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from shardstream.catalog.exclude import exclude_samples
from shardstream.shardwriter import build_shards
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.ddp import exit_rank_cleanly
from tests.streaming.shards import keys_of, make_samples

WORLD = 2
GONE = [f"s{i:06d}" for i in range(0, 48, 6)]  # 8 of 48: 40 kept, 20 per rank


def _run(rank: int, root: str, store: str, out: str, phase: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        dataset = StreamingDataset(root, seed=5, batch_size=2, decode="raw",
                                   options=StreamOptions(output="dict"))  # fmt: skip
        loader, result = StreamingDataLoader(dataset, num_workers=2), {}
        if phase == "before":
            result["consumed"] = keys_of(itertools.islice(loader, 3))
            if rank == 0:
                pathlib.Path(out, "state.json").write_text(json.dumps(loader.state_dict()))
        else:
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
def test_ranks_finish_the_epoch_then_read_only_kept_samples(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "ds"
    build_shards(make_samples(48), root, max_samples_per_shard=7)
    before = _spawn(tmp_path, root, "before")
    exclude_samples(root, GONE)
    after = _spawn(tmp_path, root, "after")
    epoch = collections.Counter(
        key for b, a in zip(before, after, strict=True) for key in b["consumed"] + a["rest"]
    )
    assert len(epoch) == 48 and set(epoch.values()) == {1}  # version 1, every sample once
    assert {len(result["rest"]) for result in after} == {after[0]["rest_max"]} == {18}
    following = collections.Counter(key for result in after for key in result["next"])
    assert {len(result["next"]) for result in after} == {after[0]["next_max"]} == {20}
    assert set(following.values()) == {1} and set(following) == {
        f"s{i:06d}" for i in range(48)
    } - set(GONE)
