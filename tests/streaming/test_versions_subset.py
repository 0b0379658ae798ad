"""A dataset made on some of the ranks only (rank 0's evaluation) under real gloo ranks.

Making a ``StreamingDataset`` (or moving it to a newer version at ``set_epoch``) must not be a
collective: rank 0 making and reading one alone and then meeting rank 1 at ``dist.barrier()``
used to hang (both ranks stuck in mismatched collectives until the process group timed out).
The process group here times out after 30 s, so a regression fails the test with gloo's
timeout instead of hanging it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import pathlib
import time
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from shardstream.shardwriter import build_shards
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.ddp import exit_rank_cleanly, spawn_ranks
from tests.shardwriter.growth import write_day
from tests.streaming.shards import keys_of

WORLD = 2
BUILD = {"max_samples_per_shard": 3}


def _make(root: str, **options: object) -> StreamingDataset:
    return StreamingDataset(
        root, seed=1, decode="raw", options=StreamOptions(output="dict", **options)
    )


@contextlib.contextmanager
def _rank(rank: int, store: str, work: str) -> Iterator[dict[str, object]]:
    """This rank in a gloo group of ``WORLD`` (30 s timeout); what it puts in the dict it is
    given is written to ``work/rank<r>.json`` at the end, after a last barrier."""
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=WORLD,
        timeout=datetime.timedelta(seconds=30),
    )  # fmt: skip
    try:
        result: dict[str, object] = {}
        yield result
        dist.barrier()
        pathlib.Path(work, f"rank{rank}.json").write_text(json.dumps(result))
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


def _run(rank: int, root: str, store: str, work: str) -> None:
    with _rank(rank, store, work) as result:
        started = time.monotonic()
        if rank == 0:  # evaluation on rank 0 alone, through real DataLoader workers, following
            alone = _make(root, follow_versions=True)  # new versions (set_epoch looks for one)
            alone.set_epoch(1)
            loader = StreamingDataLoader(alone, num_workers=2)
            result["alone"] = keys_of(loader)
            result["alone_version"] = alone.version
        dist.barrier()
        if rank == 1:  # and on rank 1 alone, in the main process (the same epoch)
            alone = _make(root)
            alone.set_epoch(1)
            result["alone"] = keys_of(alone)
        dist.barrier()
        result["alone_s"] = time.monotonic() - started
        training = _make(root)  # then every rank makes the training dataset
        result["version"], result["len"] = training.version, len(training)
        result["keys"] = keys_of(StreamingDataLoader(training, num_workers=2))


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_dataset_made_on_one_rank_alone_does_not_hang(tmp_path: pathlib.Path) -> None:
    root = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1, per_class=6), root, **BUILD)  # 12 samples
    args = (str(root), str(tmp_path / "store"), str(tmp_path))
    spawn_ranks(_run, args=args, nprocs=WORLD, join=True)
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    # Each alone reads its rank's half (the ranks are torch.distributed's), and only that.
    assert len(zero["alone"]) == len(one["alone"]) == 6
    assert len(set(zero["alone"] + one["alone"])) == 12 and zero["alone_version"] == 1
    # The training dataset every rank made afterwards still splits one version exactly.
    assert zero["version"] == one["version"] == 1 and zero["len"] == one["len"] == 6
    assert sorted(zero["keys"] + one["keys"]) == sorted(zero["alone"] + one["alone"])


def _run_local(rank: int, root: str, store: str, work: str, day2: str) -> None:
    with _rank(rank, store, work) as result:
        if rank == 0:  # the whole dataset, on rank 0 alone, then an append lands
            alone = _make(root, rank=0, world_size=1)
            result["alone"], result["alone_version"] = keys_of(alone), alone.version
            build_shards(day2, root, append=True, **BUILD)
        dist.barrier()
        training = _make(root)  # then every rank makes the training dataset
        result["version"], result["len"] = training.version, len(training)
        result["keys"] = keys_of(training)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_a_rank_local_dataset_takes_no_part_in_the_version_agreement(
    tmp_path: pathlib.Path,
) -> None:
    """A dataset given ``rank=0, world_size=1`` on one rank (the guide's advice for a rank-local
    evaluation of the training source) does not shift the count by which the ranks match the
    datasets they make later: after an append, every rank's training dataset reads the same,
    newer version."""
    root = tmp_path / "ds"
    build_shards(write_day(tmp_path / "day1", 1, per_class=6), root, **BUILD)  # 12 samples
    day2 = write_day(tmp_path / "day2", 2, per_class=3)  # 6 more
    args = (str(root), str(tmp_path / "store"), str(tmp_path), str(day2))
    spawn_ranks(_run_local, args=args, nprocs=WORLD, join=True)
    zero, one = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD))
    assert len(zero["alone"]) == 12 and zero["alone_version"] == 1  # the whole of version 1
    assert zero["version"] == one["version"] == 2 and zero["len"] == one["len"] == 9
    assert len(set(zero["keys"] + one["keys"])) == 18
