"""The remote order as the dataset grows: class mix per rank's batch, and the GETs it costs.

``benchmarks/shuffle.py`` reads its 400 MB class-ordered dataset from a real HTTP server; this
script asks how the remote order behaves past that size, where a worker stream's epoch holds
far more than a window. Datasets of ``S`` shards x 1,000 samples (about 2 MB per shard, 2 KB
per sample) are simulated as in ``benchmarks/scale.py`` (every shard name a hard link to one
real shard), and read as if written in class order: 200 classes, class ``c`` in shards
``[c * S / 200, (c + 1) * S / 200)``. Per dataset, at ``--ranks`` x ``--workers`` with batch 64,
the order's numbers that shardstream picks for these shards on an object store:

- distinct classes per batch over every rank's batches, as a share of a uniformly random
  permutation's (exact expectation), for the stratified interleave (the default) and for the
  uniform one (shardstream 0.2): computed from the plan, which the loader reads exactly
  (``tests/streaming/test_shuffle_order.py`` compares them with real DataLoader workers);
- the shard GETs one rank's epoch asks the project's Range-capable HTTP server on 127.0.0.1 for
  (``--read-rank``, default 0; ``--no-read`` skips the reads), measured at the server: how
  many, their mean and median size, how many under 0.5 MiB, and the other requests (indexes).

A stream of ``R x W`` on a dataset of ``B`` bytes holds ``B / (R W)``: with reads of 1 MiB or
more, a stream of 4 x 2 on 400 MB sees at most 47 of the 200 classes in its whole epoch, which
caps its batches at 0.86 of random's distinct classes (47 of 54.9), even if each held all
47; the larger datasets show what the order gives when that cap is gone.

Usage: python benchmarks/remote_order.py [--shards 200 2000 8000] [--ranks 4] [--workers 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _data import DATA_ROOT  # noqa: E402
from _scale_data import simulate  # noqa: E402

CLASSES, BATCH, PER_SHARD = 200, 64, 1000
_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


def remote_options(root: Path) -> dict[str, int]:
    """The order's numbers shardstream picks for these shards on an object store."""
    from shardstream._catalog import resolve_source
    from shardstream.streaming._planning.order import choose_order

    facts = resolve_source(str(root))[1].facts()
    choice = choose_order(dataclasses.replace(facts, local=False), batch_size=BATCH)
    return dataclasses.asdict(choice)


def class_mix(root: Path, shards: int, ranks: int, workers: int, interleave: str) -> float:
    """Distinct classes per batch over every rank's batches, as a share of random's."""
    from shardstream.streaming import StreamingDataset, StreamOptions
    from shardstream.streaming._control.resumestate import PassState
    from shardstream.streaming._diagnostics.mixcheck import random_distinct
    from shardstream.streaming._planning.windows import planned_batches

    per_class = shards // CLASSES
    distinct = []
    for rank in range(ranks):
        options = StreamOptions(rank=rank, world_size=ranks, interleave=interleave,  # type: ignore[arg-type]
                                **remote_options(root))  # fmt: skip
        dataset = StreamingDataset(str(root), seed=1, decode="raw", batch_size=BATCH,
                                   options=options)  # fmt: skip
        plan = dataset.plan(PassState(0), dataset.layout(workers))
        distinct += [len(np.unique(s // per_class)) for s, _ in planned_batches(plan, rank)]
    counts = np.full(CLASSES, shards * PER_SHARD // CLASSES)
    return float(np.mean(distinct)) / random_distinct(counts, BATCH)


def rank_gets(root: Path, rank: int, ranks: int, workers: int) -> dict[str, float]:
    """One rank's epoch read from the HTTP server: its shard GETs, measured at the server."""
    from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
    from tests.stores.httpserver import RangeServer

    size = (root / "tar" / "shard-00000000.tar").stat().st_size
    server = RangeServer(str(root.parent))
    try:
        started = time.perf_counter()
        options = StreamOptions(rank=rank, world_size=ranks, output="dict")
        dataset = StreamingDataset(f"{server.url}/{root.name}", seed=1, decode="raw",
                                   batch_size=BATCH, options=options)  # fmt: skip
        samples = sum(len(batch["__key__"]) for batch in StreamingDataLoader(
            dataset, num_workers=workers))  # fmt: skip
        seconds = time.perf_counter() - started
        sizes, other = [], 0
        for method, path, asked in list(server.requests):
            if method != "GET" or not path.endswith(".tar"):
                other += 1
                continue
            found = _RANGE.match(asked or "")
            last = int(found[2]) + 1 if found and found[2] else size
            sizes.append(min(size, last) - (int(found[1]) if found else 0))
    finally:
        server.stop()
    mib = np.array(sizes, dtype=np.float64) / 2**20
    return {
        "samples": samples, "seconds": seconds, "gets": len(mib), "mean": float(mib.mean()),
        "median": float(np.median(mib)), "small": int((mib < 0.5).sum()), "other": other,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, nargs="+", default=[200, 2000, 8000],
                        help="sizes in shards of 1,000 samples (multiples of 200)")  # fmt: skip
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--read-rank", type=int, default=0, help="the rank whose GETs are read")
    parser.add_argument("--no-read", action="store_true", help="class mix only (no HTTP reads)")
    parser.add_argument("--data", type=Path, default=DATA_ROOT / "scale")
    args = parser.parse_args()
    rows = []
    for shards in args.shards:
        root, _ = simulate(args.data, shards, PER_SHARD)
        stratified = class_mix(root, shards, args.ranks, args.workers, "stratified")
        uniform = class_mix(root, shards, args.ranks, args.workers, "uniform")
        gets = None if args.no_read else rank_gets(root, args.read_rank, args.ranks, args.workers)
        rows.append((shards, stratified, uniform, gets))
        print(f"  {shards} shards: {stratified:.3f} / {uniform:.3f} {gets}", flush=True)
    order = remote_options(simulate(args.data, args.shards[0], PER_SHARD)[0])
    print(f"\nremote order at {args.ranks} ranks x {args.workers} workers, batch {BATCH}: {order}")
    print(f"GETs: rank {args.read_rank}'s epoch, measured at the HTTP server\n")
    print("| dataset | per stream | distinct classes per batch, stratified (uniform) | "
          "shard GETs | mean MiB | median MiB | under 0.5 MiB | other requests |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for shards, stratified, uniform, gets in rows:
        total = shards * 2.05  # MB: 1,000 samples of 2,049 bytes
        stream = total / (args.ranks * args.workers)
        cells = ["-"] * 5 if gets is None else [
            f"{gets['gets']:,}", f"{gets['mean']:.2f}", f"{gets['median']:.2f}",
            f"{gets['small']:,}", f"{gets['other']:,}",
        ]  # fmt: skip
        print(f"| {shards:,} shards, {total / 1e3:.1f} GB | {stream / 1e3:.2f} GB | "
              f"{stratified:.2f} ({uniform:.2f}) | " + " | ".join(cells) + " |")  # fmt: skip


if __name__ == "__main__":
    main()
