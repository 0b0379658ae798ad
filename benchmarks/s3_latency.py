"""Build to and stream from a real S3 server whose every answer waits 30 or 100 ms for a first byte.

A real object store takes 10-50 ms to the first byte of every request (more across regions);
radosgw on 127.0.0.1 answers in about a millisecond. Here every request goes through
``latencyproxy.py`` (the project's own proxy, keep-alive connections, bytes moved by the kernel),
which holds back each answer's first byte by ``--delays`` milliseconds (0 = the same proxy without
delay: the baseline every ratio is taken against). Two datasets, both built first:

- ``jpeg``: the ``imagenet_like`` tree (default 20,000 JPEGs, ~1.4 GB) in 64 MiB shards, read in
  raw mode (bytes) and train mode (decode + RandomResizedCrop(224) + flip + normalize);
- ``small``: ~10 KB samples (like text-image pairs), read in raw mode.

Every row uses 2 persistent DataLoader workers, the default shuffle, batch 64: one warm-up epoch
then ``--epochs`` timed ones, the delays taking turns epoch by epoch so that background load on
the box hits them alike. "First batch" is the wait from asking an epoch's iterator to its first
batch: cold = the first epoch (workers starting), warm = later epochs (median). Client CPU is
user+system time of this process and its workers per GB read (the proxy's is left out); the plain
loop is boto3 ranged GETs of 2 MiB (shardstream's piece size on object stores) over the same
shards from 2 processes, reading every byte, at a fixed concurrency (shown); "S3 path alone"
reads the same ranges the same way through ``Store.open_read`` (the loader's S3 path without
tar parsing, planning or batches).

Targets (issue 30): raw >= 0.8x of 0 ms under 30 ms and >= 0.6x under 100 ms; train >= 0.95x
under 30 ms; first batch <= 1 s under 30 ms; client CPU <= 1.2x the plain loop; a build under
30 ms <= 1.2x the build at 0 ms.

Usage: ``python benchmarks/s3_latency.py [--images 20000] [--small 60000] [--delays 0 30 100]
[--epochs 2] [--server radosgw|moto] [--rows jpeg-raw small-raw jpeg-train]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import imagenet_like
from latencyproxy import RunningProxy, latency_proxy
from s3 import BATCH, MB, boto3_client, cpu_seconds, loader_for, s3_server

PIECE_BYTES = 2 * 2**20


def small_samples(count: int, seed: int = 0) -> Any:
    """``count`` samples of ~10 KB (random bytes: a caption-sized text and a small blob)."""
    rng = random.Random(seed)
    for index in range(count):
        size = rng.randint(6_000, 14_000)
        yield {"__key__": f"s{index:08d}", "bin": rng.randbytes(size), "cls": index % 100}


def options_for(info: dict[str, str], endpoint_url: str) -> dict[str, Any]:
    return {
        "endpoint_url": endpoint_url, "key": info["aws_access_key_id"],
        "secret": info["aws_secret_access_key"], "client_kwargs": {"region_name": info["region"]},
    }  # fmt: skip


def timed_build(source: Any, dest: str, options: dict[str, Any], workers: int) -> float:
    from shardstream import build_shards

    start = time.perf_counter()
    build_shards(source, dest, storage_options=options, workers=workers,
                 max_bytes_per_shard=64 * 2**20)  # fmt: skip
    return time.perf_counter() - start


class Row:
    """The measurements of one (dataset, mode, delay)."""

    def __init__(self, loader: tuple[Any, Any]) -> None:
        self.dataset, self.loader = loader
        self.rates: list[float] = []
        self.first: list[float] = []
        self.cpu = 0.0
        self.samples = 0


def run_epochs(rows: dict[int, Row], epochs: int, skip: frozenset[int]) -> None:
    """Warm-up plus ``epochs`` timed epochs per row, rows taking turns each epoch."""
    for number in range(epochs + 1):
        order = sorted(rows) if number % 2 else sorted(rows, reverse=True)
        for delay in order:
            row = rows[delay]
            row.dataset.set_epoch(number)
            cpu, start, samples = cpu_seconds(skip), time.perf_counter(), 0
            batches = iter(row.loader)
            for batch in batches:
                if samples == 0:
                    row.first.append(time.perf_counter() - start)
                samples += len(batch[1])
            if number:
                row.rates.append(samples / (time.perf_counter() - start))
                row.cpu += cpu_seconds(skip) - cpu
                row.samples += samples


def plain_gets(args: tuple[dict[str, Any], list[tuple[str, int, int]], int]) -> int:
    """Bytes of ``ranges`` (``(key, start, end)`` in bucket ``bench``) read with boto3's
    ``get_object`` on ``threads`` threads, with a connection for each thread (botocore's pool
    of 8 would open and drop a connection for every request past 8 in flight)."""
    info, ranges, threads = args
    s3 = boto3_client(info, connections=max(8, threads))

    def get(item: tuple[str, int, int]) -> int:
        key, start, end = item
        body = s3.get_object(Bucket="bench", Key=key, Range=f"bytes={start}-{end - 1}")["Body"]
        return len(body.read())

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(get, ranges))


def shuffled_ranges(objects: list[tuple[str, int]]) -> list[tuple[str, int, int]]:
    """Every 2 MiB range of ``objects`` (``(key, size)``), in a seeded random order."""
    ranges = [(key, start, min(size, start + PIECE_BYTES))
              for key, size in objects for start in range(0, size, PIECE_BYTES)]  # fmt: skip
    random.Random(0).shuffle(ranges)
    return ranges


def _shuffled_ranges(info: dict[str, str], prefix: str) -> list[tuple[str, int, int]]:
    """Every 2 MiB range of the ``.tar`` objects under ``prefix``, in a seeded random order."""
    s3 = boto3_client(info)
    listing = s3.list_objects_v2(Bucket="bench", Prefix=prefix)["Contents"]
    return shuffled_ranges([(item["Key"], item["Size"]) for item in listing
                            if item["Key"].endswith(".tar")])  # fmt: skip


def cpu_per_gb(work: Callable[[Any], int], config: Any, ranges: list[Any], threads: int) -> float:
    """Client CPU seconds per GB of ``work((config, ranges, threads))`` (returns bytes read)
    run by 2 processes on alternate ranges, after both warmed up (imports, connections) on
    the first 8 ranges with 1 thread."""
    halves = [(config, ranges[0::2], threads), (config, ranges[1::2], threads)]
    with ProcessPoolExecutor(2) as pool:
        list(pool.map(work, [(config, ranges[:8], 1)] * 2))
        before = cpu_seconds()
        total = sum(pool.map(work, halves))
    return (cpu_seconds() - before) / (total / 1e9)


def plain_loop(info: dict[str, str], endpoint: str, prefix: str, threads: int) -> float:
    """Client CPU seconds per GB of 2 MiB ranged GETs with boto3, 2 processes x ``threads``."""
    ranges = _shuffled_ranges(info, prefix)
    return cpu_per_gb(plain_gets, {**info, "endpoint_url": endpoint}, ranges, threads)


def store_gets(args: tuple[tuple[dict[str, Any], str], list[tuple[str, int, int]], int]) -> int:
    """Bytes of ``ranges`` (``(key, start, end)``, the key's last part a file under ``root``)
    read through ``Store(root, options).open_read`` on ``threads`` threads."""
    from shardstream._storage import Store

    (options, root), ranges, threads = args
    store = Store(root, options)

    def get(item: tuple[str, int, int]) -> int:
        key, start, end = item
        with store.open_read(key.rsplit("/", 1)[-1], start, end) as stream:
            total = 0
            while chunk := stream.read(1 << 20):
                total += len(chunk)
            return total

    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(get, ranges))


def store_loop(info: dict[str, str], endpoint: str, prefix: str, threads: int) -> float:
    """Client CPU seconds per GB of the same ranges as :func:`plain_loop` read through
    shardstream's S3 path alone (``Store.open_read``: presigned GETs, spans, retries, reused
    buffers), same processes and threads; no tar parsing, planning or batches."""
    ranges = _shuffled_ranges(info, prefix)
    root = f"s3://bench/{prefix.rstrip('/')}"
    return cpu_per_gb(store_gets, (options_for(info, endpoint), root), ranges, threads)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    found: dict[str, Any] = {"build": {}, "rows": {}, "plain": {}}
    jpegs = imagenet_like(args.images, num_classes=max(1, args.images // 100))
    with s3_server(args.server) as info, contextlib.ExitStack() as stack:
        from s3server.server import make_bucket

        make_bucket(info, "bench")
        proxies: dict[int, RunningProxy] = {
            delay: stack.enter_context(latency_proxy(info["endpoint_url"], delay))
            for delay in sorted(set(args.delays) | {0, 30})
        }  # fmt: skip
        skip = frozenset(proxy.pid for proxy in proxies.values())
        for delay in (0, 30):
            dest = f"s3://bench/build-{delay}"
            options = options_for(info, proxies[delay].endpoint_url)
            found["build"][delay] = timed_build(jpegs, dest, options, args.workers)
        datasets = {"jpeg": "s3://bench/build-0", "small": "s3://bench/small"}
        timed_build(small_samples(args.small), datasets["small"],
                    options_for(info, proxies[0].endpoint_url), args.workers)  # fmt: skip
        found["bytes"] = {name: _dataset_bytes(url, options_for(info, info["endpoint_url"]))
                          for name, url in datasets.items()}  # fmt: skip
        found["samples"] = {"jpeg": args.images, "small": args.small}
        for name, mode in (("jpeg", "raw"), ("small", "raw"), ("jpeg", "train")):
            if f"{name}-{mode}" not in args.rows:
                continue
            delays = args.delays if mode == "raw" else [d for d in args.delays if d <= 30]
            rows = {
                delay: Row(loader_for(datasets[name], mode, args.workers,
                                      options_for(info, proxies[delay].endpoint_url), True))
                for delay in delays
            }  # fmt: skip
            run_epochs(rows, args.epochs, skip)
            found["rows"][(name, mode)] = {delay: _summary(row) for delay, row in rows.items()}
            del rows
        for delay, threads in ((0, 4), (30, 16), (100, 48)):
            if delay in args.delays and "jpeg-raw" in args.rows:
                cost = plain_loop(info, proxies[delay].endpoint_url, "build-0/", threads)
                ours = store_loop(info, proxies[delay].endpoint_url, "build-0/", threads)
                found["plain"][delay] = (threads, cost, ours)
    return found


def _summary(row: Row) -> dict[str, float]:
    return {
        "rate": statistics.median(row.rates), "cold": row.first[0],
        "warm": statistics.median(row.first[1:]) if len(row.first) > 1 else row.first[0],
        "cpu": row.cpu, "samples": row.samples,
    }  # fmt: skip


def _dataset_bytes(url: str, options: dict[str, Any]) -> int:
    from shardstream._format.manifest import read_manifest

    return int(read_manifest(url, options).num_bytes)


def table(args: argparse.Namespace, found: dict[str, Any]) -> str:
    lines = [
        "| dataset, mode | first-byte delay | samples/s | MB/s | vs 0 ms | first batch cold / "
        "warm (s) | client CPU s/GB | plain GETs CPU s/GB (threads) | client/plain "
        "| S3 path alone CPU s/GB | S3 path/plain |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, mode), rows in found["rows"].items():
        sample_bytes = found["bytes"][name] / found["samples"][name]
        for delay, row in sorted(rows.items()):
            mbs = row["rate"] * sample_bytes / MB
            gb = row["samples"] * sample_bytes / 1e9
            cpu = row["cpu"] / gb
            plain = found["plain"].get(delay) if (name, mode) == ("jpeg", "raw") else None
            lines.append(
                f"| {name}, {mode} | {delay} ms | {row['rate']:,.0f} | {mbs:,.0f} | "
                f"{row['rate'] / rows[0]['rate']:.2f}x | {row['cold']:.2f} / {row['warm']:.2f} | "
                f"{cpu:.2f} | {f'{plain[1]:.2f} ({plain[0]})' if plain else ''} | "
                f"{f'{cpu / plain[1]:.2f}x' if plain else ''} | "
                f"{f'{plain[2]:.2f}' if plain else ''} | "
                f"{f'{plain[2] / plain[1]:.2f}x' if plain else ''} |"
            )
    build = found["build"]
    lines.append(f"| jpeg, build ({args.workers} workers) | 0 ms / 30 ms | {build[0]:.1f} s / "
                 f"{build[30]:.1f} s | | {build[0] / build[30]:.2f}x | | | | | | |")  # fmt: skip
    head = (f"{args.images} JPEGs ({found['bytes']['jpeg'] / MB:,.0f} MB) and {args.small} small "
            f"samples ({found['bytes']['small'] / MB:,.0f} MB) in 64 MiB shards on "
            f"{args.server} behind benchmarks/latencyproxy.py; {args.workers} persistent workers, "
            f"batch {BATCH}, median of {args.epochs} epochs after a warm-up; "
            "MB = 10^6 B")  # fmt: skip
    return head + "\n\n" + "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--small", type=int, default=60_000)
    parser.add_argument("--delays", type=int, nargs="+", default=[0, 30, 100])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--server", choices=["radosgw", "moto"], default="radosgw")
    parser.add_argument("--rows", nargs="+", default=["jpeg-raw", "small-raw", "jpeg-train"])
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    started = time.perf_counter()
    found = measure(args)
    print("\n" + table(args, found))
    print(f"\n(took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
