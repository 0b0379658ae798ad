"""A full epoch over 10,000 shards under ``ulimit -n 256``, with and without a manifest.

The default order reads from hundreds of places at once, and each open file or memory map costs
a descriptor. The epoch runs in a child process whose soft limit is 256 (inherited by its real
DataLoader workers); shard names are symbolic links to one real shard, so every name is opened
as its own file, as real shards would be.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from shardstream import build_shards
from shardstream._format.manifest import Manifest, write_manifest
from shardstream._format.shardtable import NameColumn, ShardTable
from shardstream._storage.options import too_many_open_files

NUM_SHARDS, PER_SHARD = 10_000, 3

EPOCH = r"""
import json, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
source = sys.argv[1]
options = StreamOptions(output="dict")
dataset = StreamingDataset(source, decode="raw", batch_size=64, options=options)
keys = [key for batch in StreamingDataLoader(dataset, num_workers=2) for key in batch["__key__"]]
print(json.dumps({"samples": len(keys), "distinct": len(set(keys))}))
"""


def _linked_dataset(root: pathlib.Path) -> pathlib.Path:
    real = root / "real"
    samples = ({"__key__": f"k{i}", "bin": bytes([i]) * 100, "cls": i} for i in range(PER_SHARD))
    info = build_shards(samples, real, max_samples_per_shard=PER_SHARD).shards[0]
    dest = root / "linked"
    dest.mkdir()
    for index in range(NUM_SHARDS):
        for suffix in ("tar", "idx"):
            os.symlink(real / f"shard-000000.{suffix}", dest / f"shard-{index:06d}.{suffix}")
    table = ShardTable(
        NameColumn(NUM_SHARDS, ("shard-", 6, ".tar", 0)),
        np.full(NUM_SHARDS, info.num_samples, np.int64),
        np.full(NUM_SHARDS, info.num_bytes, np.int64),
        np.zeros((NUM_SHARDS, 32), np.uint8),
        NameColumn(NUM_SHARDS, ("shard-", 6, ".idx", 0)),
    )
    write_manifest(dest, Manifest(shards=table, created_by="tests"))
    return dest


def _epoch(source: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", EPOCH, source], capture_output=True, text=True, timeout=240,
        cwd=pathlib.Path(__file__).parents[2],
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_an_epoch_of_10000_shards_fits_256_open_files(tmp_path: pathlib.Path) -> None:
    dest = _linked_dataset(tmp_path)
    counted = _epoch(str(dest))  # the default order: chunks, 512 lanes, memory maps
    assert counted["samples"] == NUM_SHARDS * PER_SHARD
    # Without a manifest: whole shards, as many open at once as the limit allows.
    pattern = f"{dest}/shard-{{000000..{NUM_SHARDS - 1:06d}}}.tar"
    uncounted = _epoch(pattern)
    assert uncounted["samples"] == NUM_SHARDS * PER_SHARD


def test_running_out_of_files_names_the_limit_and_the_fix() -> None:
    error = too_many_open_files(OSError(24, "Too many open files"), "data/shard-000001.tar")
    assert isinstance(error, OSError)
    text = str(error)
    assert "shard-000001.tar" in text and "ulimit -n" in text and "num_open" in text
    other = OSError(2, "No such file")
    assert too_many_open_files(other, "x") is other
