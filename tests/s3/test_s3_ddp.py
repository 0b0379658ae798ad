"""Two real gloo ranks streaming one dataset from S3: equal batch counts, union vs manifest."""

from __future__ import annotations

import collections
import datetime
import json
import pathlib
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.ddp import exit_rank_cleanly, spawn_ranks
from tests.s3.s3env import BUCKET

torch = pytest.importorskip("torch")
WORLD = 2
DEST = f"s3://{BUCKET}/ddp/train"
JOIN_TIMEOUT_S = 150.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _epoch_keys(policy: str, storage_options: dict[str, Any]) -> dict[str, Any]:
    from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions

    dataset = StreamingDataset(
        DEST, batch_size=2, policy=policy, decode="raw",
        options=StreamOptions(output="dict", storage_options=storage_options),
    )  # fmt: skip
    batches = list(StreamingDataLoader(dataset, num_workers=1))
    keys = [key for batch in batches for key in batch["__key__"]]
    return {"keys": keys, "batches": len(batches), "len": len(dataset)}


def _rank(rank: int, port: int, storage_options: dict[str, Any], out: str) -> None:
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    try:
        result = {policy: _epoch_keys(policy, storage_options) for policy in ("pad", "drop")}
        count = torch.tensor([result["pad"]["batches"]])
        dist.all_reduce(count, op=dist.ReduceOp.MAX)  # unequal epochs would hang real training
        pathlib.Path(out, f"{rank}.json").write_text(json.dumps(result))
        dist.barrier()  # gloo can abort a rank that tears down while a peer still talks to it
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


def _run_ranks(target: Callable[..., None], args: tuple[Any, ...]) -> None:
    """Spawn ``WORLD`` ranks and join them, killing all of them after ``JOIN_TIMEOUT_S``."""
    context = spawn_ranks(target, args=args, nprocs=WORLD, join=False)
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    try:
        while not context.join(timeout=1.0):
            if time.monotonic() > deadline:
                raise TimeoutError(f"ranks did not finish within {JOIN_TIMEOUT_S}s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join(10)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_two_ranks_stream_from_s3(
    make_image_folder: Callable[..., pathlib.Path],
    storage_options: dict[str, Any],
    tmp_path: pathlib.Path,
) -> None:
    from shardstream import build_shards

    images = make_image_folder(num_classes=3, per_class=9)  # 27 samples: uneven over 2 ranks
    manifest = build_shards(images, DEST, storage_options=storage_options, max_samples_per_shard=5)
    assert manifest.num_samples == 27 and len(manifest.shards) == 6
    _run_ranks(_rank, (_free_port(), storage_options, str(tmp_path)))
    results = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(WORLD)]
    for policy, total in (("pad", 28), ("drop", 26)):
        per_rank = [result[policy] for result in results]
        assert {r["batches"] for r in per_rank} == {per_rank[0]["len"]}, per_rank
        assert {len(r["keys"]) for r in per_rank} == {total // WORLD}
        seen = collections.Counter(key for r in per_rank for key in r["keys"])
        assert sum(seen.values()) == total
        if policy == "pad":
            assert len(seen) == manifest.num_samples  # every sample, one repeated
        else:
            assert max(seen.values()) == 1 and len(seen) == total  # none repeated
