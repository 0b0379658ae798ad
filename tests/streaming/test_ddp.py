"""Real multi-rank runs with torch.distributed (gloo): union vs manifest, equal batches, DDP."""

from __future__ import annotations

import collections
import json
import pathlib

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.ddp import exit_rank_cleanly, spawn_ranks
from tests.streaming.shards import make_dataset

WORLD = 3


def _epochs(rank: int, root: str, store: str, out: str, policy: str, plain: bool) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        ds = StreamingDataset(
            root, batch_size=2, policy=policy, options=StreamOptions(output="dict")
        )
        loader: DataLoader = StreamingDataLoader(ds, num_workers=2)
        if plain:  # what many scripts do: persistent workers and no set_epoch at all
            loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
        result = {}
        for epoch in range(2):
            if not plain:
                ds.set_epoch(epoch)
            keys = [key for batch in loader for key in batch["__key__"]]
            count = torch.tensor([len(keys)])
            dist.all_reduce(count, op=dist.ReduceOp.MAX)  # a hang here would mean unequal epochs
            result[epoch] = {"keys": keys, "batches": len(ds)}
        pathlib.Path(out, f"{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # gloo can abort a rank that tears down while a peer still talks to it
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


@pytest.mark.slow
@pytest.mark.parametrize(
    "policy,plain", [("pad", False), ("drop", True)], ids=["pad-streaming", "drop-plain-persistent"]
)
def test_ranks_cover_the_manifest(tmp_path: pathlib.Path, policy: str, plain: bool) -> None:
    root, manifest = make_dataset(tmp_path, 23, 5)
    spawn_ranks(
        _epochs,
        args=(str(root), str(tmp_path / "store"), str(tmp_path), policy, plain),
        nprocs=WORLD,
        join=True,
    )
    results = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(WORLD)]
    for epoch in ("0", "1"):
        lengths = {len(r[epoch]["keys"]) for r in results}
        assert len(lengths) == 1, f"ranks yielded different counts: {lengths}"
        seen = collections.Counter(k for r in results for k in r[epoch]["keys"])
        if policy == "pad":
            assert len(seen) == manifest.num_samples and sum(seen.values()) == 24
        else:
            assert max(seen.values()) == 1 and len(seen) == 21
    assert results[0]["0"]["keys"] != results[0]["1"]["keys"]


def _train(rank: int, root: str, store: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(
            torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 12 * 16, 4))
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        ds = StreamingDataset(root, batch_size=4)
        for epoch in range(2):
            ds.set_epoch(epoch)
            for images, labels in StreamingDataLoader(ds, num_workers=1):
                loss = torch.nn.functional.cross_entropy(model(images.float() / 255), labels)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        dist.barrier()  # gloo can abort a rank that tears down while a peer still talks to it
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


@pytest.mark.slow
def test_short_ddp_training_finishes(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 29, 4)  # 29 samples: uneven, needs padding to not hang
    spawn_ranks(_train, args=(str(root), str(tmp_path / "store")), nprocs=WORLD, join=True)
