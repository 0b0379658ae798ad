"""The loading benchmark's extra rows: class mix per batch, start-up at many tiny samples, and
one epoch from a cold page cache. ``benchmarks/load.py`` runs each in a fresh child process."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

from _measure import BATCH, PeakRss


def class_mix(row: str, paths: dict) -> float:
    """Mean distinct classes per batch / expected under uniform sampling (class-ordered shards)."""
    from torch.utils.data import DataLoader

    num_classes = paths["num_classes"]
    if row == "webdataset":
        import webdataset as wds

        urls = sorted(str(p) for p in Path(paths["ordered"]).glob("shard-*.tar"))
        ds = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000)
        loader = DataLoader(
            ds.to_tuple("cls"),
            batch_size=BATCH,
            num_workers=2,
            collate_fn=lambda b: [int(x[0]) for x in b],
        )
        batches = list(loader)
    else:
        from shardstream.streaming import StreamingDataset

        ds = StreamingDataset(paths["ordered"], decode="raw", batch_size=BATCH)
        batches = [labels.tolist() for _, labels in DataLoader(ds, batch_size=None, num_workers=2)]
    uniform = num_classes * (1 - (1 - 1 / num_classes) ** BATCH)
    full = [b for b in batches if len(b) == BATCH]
    return sum(len(set(b)) for b in full) / len(full) / uniform


def startup(row: str, paths: dict) -> dict:
    """Time to first batch and peak memory on the tiny-sample tree (or its shards)."""
    from torch.utils.data import DataLoader

    memory = PeakRss()
    start = time.perf_counter()
    if row == "imagefolder":
        from torchvision.datasets import ImageFolder

        ds = ImageFolder(paths["tiny"], loader=lambda p: Path(p).read_bytes())
        next(iter(DataLoader(ds, batch_size=BATCH, shuffle=True, collate_fn=lambda b: b)))
    else:
        from shardstream.streaming import StreamingDataset

        ds = StreamingDataset(paths["tiny_shards"], decode="raw", batch_size=BATCH)
        next(iter(DataLoader(ds, batch_size=None, num_workers=0)))
    return {"first_s": time.perf_counter() - start, "mb": memory.stop()}


def report_extra(args: argparse.Namespace, paths: dict, spawn: Callable[[dict], dict]) -> None:
    """Print the extra rows, each run in a fresh process by ``spawn``."""
    print("\n| extra | loader | result |\n|---|---|---|")
    for row in ("webdataset", "shardstream"):
        r = spawn({"kind": "mix", "row": row, "paths": paths})
        print(
            f"| class mix, class-ordered shards (uniform = 1.00) | {row} | "
            f"{r.get('mix', float('nan')):.2f} {r.get('error', '')} |"
        )
    if args.tiny:
        for row in ("imagefolder", "shardstream"):
            r = spawn({"kind": "startup", "row": row, "paths": paths})
            print(
                f"| start-up at {args.tiny} tiny samples | {row} | "
                f"{r.get('first_s', float('nan')):.2f} s to first batch, "
                f"{r.get('mb', float('nan')):.0f} MB {r.get('error', '')} |"
            )
    for row in ("imagefolder", "shardstream"):
        r = spawn({"kind": "cold", "row": row, "mode": "raw", "workers": 2, "paths": paths})
        if "error" in r:
            print(
                f"| cold cache, raw, 2 workers | {row} | skipped: cannot drop the page cache "
                f"({r['error'][:80]}) |"
            )
        else:
            print(f"| cold cache, raw, 2 workers | {row} | {r['per_s']:.0f} samples/s |")
