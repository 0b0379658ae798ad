"""Simulated datasets for benchmarks/scale.py: millions of readable shards on one disk.

A dataset of ``S`` shards x ``n`` samples is a manifest whose shard names are
``tar/shard-%08d.tar`` with indexes ``idx/shard-%08d.idx``. Every name is a *hard link* to one
of a few copies of one real shard of ``n`` samples (ext4 allows 65,000 links to a file, and a
hard link costs no inode: ten million symbolic links would need more inodes than the disk has).
The links live in a pool per sample count, ``pool-n/tar`` and ``pool-n/idx``, shared by every
dataset of that sample count through symbolic links to those two folders; so planning,
manifests, indexes and reads are real while the bytes are shared.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

_LINKS_PER_COPY = 60_000  # under ext4's 65,000 links per file


def _real_shard(pool: Path, per_shard: int) -> dict:
    """Build the one real shard of ``per_shard`` samples (once); its facts."""
    facts_path = pool / "real.json"
    if facts_path.exists():
        return json.loads(facts_path.read_text())
    from shardstream import build_shards

    samples = (
        {"__key__": f"k{i:08d}", "jpg": bytes(64), "cls": i % 1000} for i in range(per_shard)
    )
    built = build_shards(samples, pool / "real", max_samples_per_shard=per_shard, overwrite=True)
    info = built.shards[0]
    facts = {"num_samples": info.num_samples, "num_bytes": info.num_bytes, "sha256": info.sha256}
    facts_path.write_text(json.dumps(facts))
    return facts


def link_pool(data: Path, per_shard: int, num_shards: int) -> Path:
    """``pool-n`` with at least ``num_shards`` linked names (added to what is there)."""
    pool = data / f"pool-{per_shard}"
    pool.mkdir(parents=True, exist_ok=True)
    _real_shard(pool, per_shard)
    done_path = pool / "linked.json"
    done = json.loads(done_path.read_text())["count"] if done_path.exists() else 0
    for suffix in ("tar", "idx"):
        (pool / suffix).mkdir(exist_ok=True)
    for copy in range(done // _LINKS_PER_COPY, -(-num_shards // _LINKS_PER_COPY)):
        first = max(done, copy * _LINKS_PER_COPY)
        for suffix in ("tar", "idx"):
            source = pool / "copies" / f"{copy:04d}.{suffix}"
            if not source.exists():
                source.parent.mkdir(exist_ok=True)
                shutil.copyfile(pool / "real" / f"shard-000000.{suffix}", source)
            folder = f"{pool}/{suffix}"
            for index in range(first, min(num_shards, (copy + 1) * _LINKS_PER_COPY)):
                target = f"{folder}/shard-{index:08d}.{suffix}"
                if not os.path.lexists(target):  # an interrupted run may have made it
                    os.link(source, target)
        done_path.write_text(json.dumps({"count": min(num_shards, (copy + 1) * _LINKS_PER_COPY)}))
    done_path.write_text(json.dumps({"count": max(done, num_shards)}))
    return pool


def simulate(data: Path, num_shards: int, per_shard: int) -> tuple[Path, float]:
    """The dataset ``sim-SxN`` (made once): its folder and the seconds making it took."""
    from shardstream._format.manifest import Manifest, write_manifest
    from shardstream._format.shardtable import NameColumn, ShardTable

    root = data / f"sim-{num_shards}x{per_shard}"
    marker = root / ".complete"
    if marker.exists():
        return root, 0.0
    started = time.perf_counter()
    pool = link_pool(data, per_shard, num_shards)
    facts = json.loads((pool / "real.json").read_text())
    root.mkdir(parents=True, exist_ok=True)
    for suffix in ("tar", "idx"):
        link = root / suffix
        if not link.is_symlink():
            os.symlink(os.path.relpath(pool / suffix, root), link)
    sha = np.frombuffer(bytes.fromhex(facts["sha256"]), np.uint8)
    table = ShardTable(
        NameColumn(num_shards, ("tar/shard-", 8, ".tar", 0)),
        np.full(num_shards, facts["num_samples"], np.int64),
        np.full(num_shards, facts["num_bytes"], np.int64),
        np.broadcast_to(sha, (num_shards, 32)).copy(),
        NameColumn(num_shards, ("idx/shard-", 8, ".idx", 0)),
    )
    write_manifest(root, Manifest(shards=table, created_by="benchmarks/scale.py"))
    marker.write_text(str(num_shards))
    return root, time.perf_counter() - started
