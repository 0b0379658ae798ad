"""Build to and stream from a real S3 server (Ceph radosgw on 127.0.0.1) against local disk.

Builds the ``imagenet_like`` tree (default 8,000 JPEGs, ~690 MB, in 64 MiB shards) once to a
local folder and once to ``s3://bench/train`` on radosgw (``benchmarks/s3server``, started and
stopped here; ``--server moto`` uses moto_server instead), then streams each location in "raw"
mode (bytes, no decode) and "train" mode (decode + RandomResizedCrop(224) + flip + normalize, as
in ``benchmarks/load.py``): one untimed warm-up epoch, then the median of ``--epochs`` epochs,
local and S3 epochs taking turns so that background load on the box hits both alike.
In the same run it measures the server's ceilings: whole-shard GETs with plain boto3 on 1 and 4
threads, and PutObjects of the built shards (already in memory) on ``--workers`` threads.
CPU s/GB is the user+system time of this process and its DataLoader workers (waited for,
``getrusage``) per GB of shards read; the server's own CPU (radosgw + OSD) is shown apart.

Targets: raw S3 >= 0.7x the ceiling, train S3 >= 0.95x train local, build S3 >= 0.7x local.
The client and server share the machine's cores, so the numbers are noisy on a busy box: the
rates are medians, and the ceiling is measured between the build and the reads.

Usage: ``python benchmarks/s3.py [--images 8000] [--workers 2] [--shard-mib 64]
[--persistent-workers]``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import imagenet_like
from load import transform_for

BATCH = 64
MB = 1e6


@contextlib.contextmanager
def moto_server() -> Iterator[str]:
    """A moto_server on a free loopback port, stopped on exit."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = shutil.which("moto_server") or "moto_server"
    process = subprocess.Popen(
        [command, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/moto-api/"):
                break
            time.sleep(0.1)
        yield url
    finally:
        process.terminate()
        process.wait(10)


@contextlib.contextmanager
def s3_server(kind: str) -> Iterator[dict[str, str]]:
    """Endpoint and keys of a fresh S3 server with bucket ``bench`` (radosgw or moto)."""
    if kind == "moto":
        with moto_server() as url:
            yield {"endpoint_url": url, "aws_access_key_id": "bench",
                   "aws_secret_access_key": "bench", "region": "us-east-1"}  # fmt: skip
        return
    from s3server.server import radosgw

    with radosgw() as info:
        yield info


def cpu_seconds(exclude: frozenset[int] = frozenset()) -> float:
    """User + system CPU time of this process, its waited-for children and its live ones
    (persistent DataLoader workers are never waited for while they run), but ``exclude``."""
    import psutil

    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    for child in psutil.Process().children(recursive=True):
        if child.pid in exclude:
            continue
        with contextlib.suppress(psutil.Error):
            times = child.cpu_times()
            total += times.user + times.system
    return total


def server_cpu(info: dict[str, str]) -> float:
    """CPU seconds used so far by the radosgw and OSD daemons (0 for moto)."""
    if "dir" not in info:
        return 0.0
    import psutil

    total = 0.0
    for name in ("rgw", "osd"):
        pid = int(Path(info["dir"], "run", f"{name}.pid").read_text().strip())
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def loader_for(
    dest: str, mode: str, workers: int, options: dict | None, persistent: bool = False,
    streaming: bool = False,
) -> Any:  # fmt: skip
    """A DataLoader over ``dest`` in ``mode`` (and its dataset, for ``set_epoch``); with
    ``streaming`` shardstream's ``StreamingDataLoader`` (whose persistent workers fetch the next
    epoch's first pieces as an epoch ends), else torch's."""
    from torch.utils.data import DataLoader

    from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions

    dataset = StreamingDataset(
        dest, decode="raw" if mode == "raw" else "pil", transform=transform_for(mode),
        batch_size=BATCH, options=StreamOptions(storage_options=options),
    )  # fmt: skip
    persistent = persistent and workers > 0
    if streaming:
        return dataset, StreamingDataLoader(
            dataset, num_workers=workers, persistent_workers=persistent
        )
    return dataset, DataLoader(dataset, batch_size=None, num_workers=workers,
                               persistent_workers=persistent)  # fmt: skip


def compare(
    mode: str, places: dict[str, tuple[str, dict | None]], args: argparse.Namespace,
    info: dict[str, str],
) -> dict[str, dict[str, float]]:  # fmt: skip
    """Epochs of every place in turn (one warm-up each, then ``args.epochs`` timed rounds).

    Interleaving the places spreads any background load on the box over all of them alike.
    Returns per place the median samples/s, and the client and server CPU seconds summed over
    the timed epochs.
    """
    loaders = {name: loader_for(dest, mode, args.workers, opts, args.persistent_workers)
               for name, (dest, opts) in places.items()}  # fmt: skip
    found: dict[str, dict[str, Any]] = {name: {"rates": [], "cpu": 0.0, "server_cpu": 0.0}
                                        for name in places}  # fmt: skip
    for number in range(args.epochs + 1):
        order = list(loaders) if number % 2 else list(reversed(loaders))
        for name in order:
            dataset, loader = loaders[name]
            dataset.set_epoch(number)
            cpu, server, start, samples = cpu_seconds(), server_cpu(info), time.perf_counter(), 0
            for batch in loader:
                samples += len(batch[1])
            if number:  # epoch 0 warms up: imports, connections, page cache
                found[name]["rates"].append(samples / (time.perf_counter() - start))
                found[name]["cpu"] += cpu_seconds() - cpu
                found[name]["server_cpu"] += server_cpu(info) - server
    for row in found.values():
        row["rate"] = statistics.median(row["rates"])
        row["epochs"] = args.epochs
    return found


def build(
    source: Path, dest: str, storage_options: dict | None, workers: int, shard_mib: int = 16
) -> float:
    """Seconds to build ``dest`` from ``source``."""
    from shardstream import build_shards

    start = time.perf_counter()
    build_shards(
        source, dest, storage_options=storage_options, workers=workers,
        max_bytes_per_shard=shard_mib * 2**20,
    )  # fmt: skip
    return time.perf_counter() - start


def boto3_client(info: dict[str, str], connections: int = 8) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=info["endpoint_url"], aws_access_key_id=info["aws_access_key_id"],
        aws_secret_access_key=info["aws_secret_access_key"], region_name=info["region"],
        config=Config(s3={"addressing_style": "path"}, max_pool_connections=connections),
    )  # fmt: skip


def put_ceiling(info: dict[str, str], folder: str, threads: int) -> float:
    """MB/s of whole-shard PutObjects with plain boto3 of the local build's shards (read
    into memory first: the server's write speed, without reading or packing images)."""
    s3 = boto3_client(info)
    shards = [path.read_bytes() for path in sorted(Path(folder).glob("*.tar"))]

    def put(numbered: tuple[int, bytes]) -> int:
        s3.put_object(Bucket="bench", Key=f"ceiling/{numbered[0]}.tar", Body=numbered[1])
        return len(numbered[1])

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(put, enumerate(shards)))
    return total / MB / (time.perf_counter() - start)


def ceiling(info: dict[str, str], prefix: str, rounds: int = 2) -> dict[int, float]:
    """MB/s of whole-shard GETs with plain boto3, on 1 and 4 threads (after a warm-up pass)."""
    s3 = boto3_client(info)
    listing = s3.list_objects_v2(Bucket="bench", Prefix=prefix)["Contents"]
    keys = [item["Key"] for item in listing if item["Key"].endswith(".tar")]

    def get(key: str) -> int:
        return len(s3.get_object(Bucket="bench", Key=key)["Body"].read())

    result = {}
    for threads in (4, 1, 4):  # the first pass warms connections and caches up
        start = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            total = sum(pool.map(get, keys * rounds))
        result[threads] = total / MB / (time.perf_counter() - start)
    return result


def measure(args: argparse.Namespace, source: Path, scratch: str) -> dict[str, Any]:
    """Build locally and to S3, measure the server's ceiling, then stream both places."""
    local = str(Path(scratch) / "train")
    found: dict[str, Any] = {"local": {"build": build(source, local, None, args.workers,
                                                      args.shard_mib)}}  # fmt: skip
    with s3_server(args.server) as info:
        from s3server.server import make_bucket

        make_bucket(info, "bench")
        options = {
            "endpoint_url": info["endpoint_url"], "key": info["aws_access_key_id"],
            "secret": info["aws_secret_access_key"],
            "client_kwargs": {"region_name": info["region"]},
        }  # fmt: skip
        remote = "s3://bench/train"
        found["s3"] = {"build": build(source, remote, options, args.workers, args.shard_mib)}
        found["s3"]["put"] = put_ceiling(info, local, args.workers)
        found["s3"]["ceiling"] = ceiling(info, "train/")
        found["s3"]["bytes"] = _dataset_bytes(remote, options)
        found["local"]["bytes"] = _dataset_bytes(local, None)
        places = {"local": (local, None), "s3": (remote, options)}
        for mode in args.modes:
            for name, row in compare(mode, places, args, info).items():
                found[name][mode] = row
    return found


def _dataset_bytes(url: str, options: dict | None) -> int:
    from shardstream._format.manifest import read_manifest

    return int(read_manifest(url, options).num_bytes)


def table(args: argparse.Namespace, local: dict[str, Any], s3: dict[str, Any]) -> str:
    """The markdown table of one run."""
    gb = s3["bytes"] / 1e9
    top = max(s3["ceiling"][1], s3["ceiling"][4])
    build_mbs = [place["bytes"] / MB / place["build"] for place in (local, s3)]
    rows = [
        "| | local disk | S3 | S3/local | S3/ceiling |",
        "|---|---|---|---|---|",
        f"| build, {args.workers} workers (s) | {local['build']:.1f} | {s3['build']:.1f} | "
        f"{local['build'] / s3['build']:.2f}x | |",
        f"| build (MB/s) | {build_mbs[0]:,.0f} | {build_mbs[1]:,.0f} | | "
        f"{build_mbs[1] / s3['put']:.2f}x |",
    ]
    for mode in args.modes:
        here, there = local[mode], s3[mode]
        mbs = [row["rate"] * local["bytes"] / args.images / MB for row in (here, there)]
        cell = f"{mbs[1] / top:.2f}x" if mode == "raw" else ""
        rows.append(f"| {mode} (samples/s) | {here['rate']:,.0f} | {there['rate']:,.0f} | "
                    f"{there['rate'] / here['rate']:.2f}x | {cell} |")  # fmt: skip
        rows.append(f"| {mode} (MB/s) | {mbs[0]:,.0f} | {mbs[1]:,.0f} | | |")
        cpu = [row["cpu"] / (row["epochs"] * gb) for row in (here, there)]
        rows.append(f"| {mode}: client CPU s/GB (server) | {cpu[0]:.2f} | {cpu[1]:.2f} "
                    f"({there['server_cpu'] / (there['epochs'] * gb):.2f}) | | |")  # fmt: skip
    rows.append(f"| write ceiling: boto3 PutObject of the built shards, {args.workers} threads "
                f"(MB/s) | | {s3['put']:,.0f} | | 1.00x |")  # fmt: skip
    rows.append(f"| ceiling: boto3 whole-shard GETs (MB/s) | | 1 thread {s3['ceiling'][1]:,.0f}, "
                f"4 threads {s3['ceiling'][4]:,.0f} | | 1.00x |")  # fmt: skip
    head = (f"{args.images} images ({s3['bytes'] / MB:,.0f} MB) in {args.shard_mib} MiB shards, "
            f"{args.workers} {'persistent ' if args.persistent_workers else ''}workers, "
            f"batch {BATCH}, server {args.server}, median of "
            f"{args.epochs} epochs after a warm-up; MB = 10^6 B")  # fmt: skip
    return head + "\n\n" + "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--shard-mib", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=3, help="timed epochs per row")
    parser.add_argument("--modes", nargs="+", default=["raw", "train"])
    parser.add_argument("--server", choices=["radosgw", "moto"], default="radosgw")
    parser.add_argument("--persistent-workers", action="store_true",
                        help="keep DataLoader workers across epochs (both places)")  # fmt: skip
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    source = imagenet_like(args.images, num_classes=max(1, args.images // 100))
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        found = measure(args, source, scratch)
    print("\n" + table(args, found["local"], found["s3"]))
    print(f"\n(took {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
