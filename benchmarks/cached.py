"""Remote shards with and without the local shard cache, behind the latency proxy.

The datasets of benchmarks/stores.py (``--small`` samples of ~10 KB in 8 MiB shards, and
``--images`` ImageNet-like JPEGs in 16 MiB shards, with manifests, built once under
bench-data/) are served by the project's Range-capable HTTP server on 127.0.0.1, with
``benchmarks/latencyproxy.py`` in front holding back every answer's first byte by ``--delay``
ms. Each row reads raw bytes with 2 DataLoader workers, batch 64, the default order, for two
epochs in one process (workers not persistent): once without a cache (the remote order, ranged
GETs), once with ``ReadOptions(cache_dir=..., cache_max_bytes=16 GiB)`` on a folder empty at
the start (the dataset fits, so the local order; the first epoch downloads every shard whole,
in the background as announced, the second reads the folder). samples/s per epoch, the first
batch's wait, and the ratio of each cached epoch to the same epoch without the cache; each the
median of ``--repeat`` runs (a fresh cache folder each).

Usage: python benchmarks/cached.py [--small 12000] [--images 2000] [--delay 30] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.stores: the server

from latencyproxy import latency_proxy
from stores import build

from tests.stores.httpserver import RangeServer

EPOCHS, WORKERS, BATCH = 2, 2, 64
CACHE_BYTES = 16 << 30  # holds either dataset: the local order needs a stated limit


def epochs(url: str, cache: str | None) -> list[tuple[float, float]]:
    """``(samples/s, first batch s)`` of each epoch of ``url`` read raw."""
    from shardstream._storage import ReadOptions
    from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions

    read = ReadOptions(cache_dir=cache, cache_max_bytes=CACHE_BYTES if cache else None)
    options = StreamOptions(output="dict", read_options=read)
    dataset = StreamingDataset(url, decode="raw", batch_size=BATCH, seed=0, options=options)
    found = []
    for epoch in range(EPOCHS):
        dataset.set_epoch(epoch)
        start, first, count = time.perf_counter(), 0.0, 0
        for batch in StreamingDataLoader(dataset, num_workers=WORKERS):
            first = first or time.perf_counter() - start
            count += len(batch["__key__"])
        found.append((count / (time.perf_counter() - start), first))
    return found


def median_epochs(runs: list[list[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Each epoch's median samples/s and median first batch over the runs."""
    return [
        (statistics.median(rate for rate, _ in epoch), statistics.median(f for _, f in epoch))
        for epoch in zip(*runs, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--small", type=int, default=12000)
    parser.add_argument("--small-shard-mib", type=int, default=8)
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--jpeg-shard-mib", type=int, default=16)
    parser.add_argument("--delay", type=float, default=30.0, help="first-byte delay, ms")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    root = build(args)
    began = time.perf_counter()
    rows: list[tuple[str, str, list[tuple[float, float]]]] = []
    server = RangeServer(str(root))
    try:
        with latency_proxy(server.url, args.delay) as proxy:
            for name in ("small", "jpeg"):
                for label in ("no cache", "cache_dir"):
                    runs = []
                    for _ in range(args.repeat):
                        with tempfile.TemporaryDirectory(prefix="cached-bench-") as folder:
                            cache = folder if label == "cache_dir" else None
                            runs.append(epochs(f"{proxy.endpoint_url}/{name}", cache))
                    rows.append((name, label, median_epochs(runs)))
    finally:
        server.stop()
    seconds = time.perf_counter() - began
    print(f"\nHTTP server behind {args.delay:g} ms of first-byte latency, raw, {WORKERS} workers,"
          f" batch {BATCH}, median of {args.repeat}, {seconds:.0f} s\n")  # fmt: skip
    print(
        "| dataset | read | epoch 1 samples/s (first batch s) | epoch 2 samples/s (first "
        "batch s) | vs no cache, epochs 1 / 2 |"
    )
    print("|---|---|---:|---:|---|")
    baseline: dict[str, Any] = {}
    for name, label, found in rows:
        base = baseline.setdefault(name, found)
        cells = [f"{rate:,.0f} ({first:.2f})" for rate, first in found]
        pairs = zip(found, base, strict=True)
        ratios = " / ".join(f"{rate / ref:.2f}x" for (rate, _), (ref, _) in pairs)
        print(f"| {name} | {label} | {' | '.join(cells)} | {ratios} |")


if __name__ == "__main__":
    main()
