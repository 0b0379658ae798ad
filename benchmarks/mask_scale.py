"""Exact evaluation and checked resumes at a billion samples: ``policy="mask"`` against ``pad``.

Uses ``scale.py``'s simulated dataset (``--shards`` x ``--per-shard`` samples, every shard name a
link to one real shard). Each policy runs in a fresh process, as the last rank of ``--world``
(with ``mask``, the rank whose part ends in fillers), batch 256, raw, no workers:

- start-up: ``StreamingDataset`` + ``len``;
- first batch of a fresh epoch (and the valid entries in it);
- ``load_state_dict`` of a state half-way through epoch 5, then ``check_position`` against the
  trainer's step, then the first batch after the restore.

Usage: python benchmarks/mask_scale.py [--shards 1000000] [--per-shard 1000] [--world 48]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _data import DATA_ROOT  # noqa: E402
from scale import build_simulation  # noqa: E402

ROW_CODE = r"""
import json, sys, time
import torch
from shardstream import StreamingDataLoader, StreamingDataset, StreamOptions, check_position
root, world, policy = sys.argv[1], int(sys.argv[2]), sys.argv[3]
result = {}

def make():
    options = StreamOptions(rank=world - 1, world_size=world)
    dataset = StreamingDataset(root, decode="raw", batch_size=256, policy=policy, options=options)
    return StreamingDataLoader(dataset, num_workers=0)

started = time.perf_counter()
loader = make()
length = len(loader)
result["startup_s"] = time.perf_counter() - started
started = time.perf_counter()
batch = next(iter(loader))
result["first_batch_s"] = time.perf_counter() - started
result["valid"] = int(batch[2].sum()) if policy == "mask" else len(batch[1])
state = loader.state_dict()
step = 5 * length + length // 2  # half-way through epoch 5, as the trainer counts it
state.update(epoch=5, consumed_batches=length // 2, global_batches=step)
loader = make()
started = time.perf_counter()
loader.load_state_dict(state)
result["restore_s"] = time.perf_counter() - started
started = time.perf_counter()
check_position(loader, step)
result["check_ms"] = (time.perf_counter() - started) * 1000
started = time.perf_counter()
next(iter(loader))
result["restored_batch_s"] = time.perf_counter() - started
result["batches_per_epoch"] = length
print(json.dumps(result))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1_000_000)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--world", type=int, default=48)
    parser.add_argument("--data", type=Path, default=DATA_ROOT / "scale")
    args = parser.parse_args()
    root = args.data / f"sim-{args.shards}x{args.per_shard}"
    build_simulation(root, args.shards, args.per_shard)
    samples = args.shards * args.per_shard
    print(f"{args.shards:,} shards x {args.per_shard:,} = {samples:,} samples; rank "
          f"{args.world - 1} of {args.world}; batch 256, raw, no workers\n")  # fmt: skip
    print("| policy | start-up s | first batch s | restore s | check_position ms | "
          "first batch after restore s |\n|---|---:|---:|---:|---:|---:|")  # fmt: skip
    for policy in ("pad", "mask"):
        out = subprocess.run(
            [sys.executable, "-c", ROW_CODE, str(root), str(args.world), policy],
            capture_output=True, text=True, timeout=1800, check=True,
        )  # fmt: skip
        row = json.loads(out.stdout.strip().splitlines()[-1])
        print(f"| {policy} | {row['startup_s']:.2f} | {row['first_batch_s']:.2f} "
              f"| {row['restore_s']:.2f} | {row['check_ms']:.2f} "
              f"| {row['restored_batch_s']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
