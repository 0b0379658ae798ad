"""A real 2-rank (gloo) x 2-worker job in two phases, for the tests of restarts across a new
version: "before" reads a few batches per rank and rank 0 saves the (shared) state; "after",
restarted on whatever was published meanwhile, reads the rest of the epoch and the next one."""

from __future__ import annotations

import itertools
import json
import pathlib

import torch
import torch.distributed as dist

from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.ddp import exit_rank_cleanly, spawn_ranks
from tests.streaming.shards import keys_of

WORLD = 2


def _run(rank: int, root: str, store: str, out: str, phase: str, seed: int, batches: int) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD)
    try:
        dataset = StreamingDataset(root, seed=seed, batch_size=2, decode="raw",
                                   options=StreamOptions(output="dict"))  # fmt: skip
        loader, result = StreamingDataLoader(dataset, num_workers=2), {}
        if phase == "before":
            result["consumed"] = keys_of(itertools.islice(loader, batches))
            if rank == 0:
                pathlib.Path(out, "state.json").write_text(json.dumps(loader.state_dict()))
        else:  # restarted: the rest of the interrupted epoch, then the next one
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


def run_phase(tmp_path: pathlib.Path, root: pathlib.Path, phase: str, *, seed: int,
              batches: int) -> list[dict]:  # fmt: skip
    """Run ``phase`` ("before" reads ``batches`` batches per rank) on every rank; per rank,
    the keys it read: ``consumed``, or ``rest``/``next`` with their maxima over ranks."""
    store = tmp_path / f"store-{phase}"
    args = (str(root), str(store), str(tmp_path), phase, seed, batches)
    spawn_ranks(_run, args=args, nprocs=WORLD, join=True)
    return [json.loads((tmp_path / f"{phase}-{r}.json").read_text()) for r in range(WORLD)]
