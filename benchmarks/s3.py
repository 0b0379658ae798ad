"""Build to and stream from a local S3 server (moto) against the same dataset on local disk.

Starts its own ``moto_server`` on 127.0.0.1, builds the ``imagenet_like`` tree once to a local
folder and once to ``s3://bench/train``, then streams each (one warm-up epoch, then the median
of 3 timed epochs) in "raw" mode (bytes, no decode) and "train" mode (decode +
RandomResizedCrop(224) + flip + float tensor, as in ``benchmarks/load.py``), and prints a
markdown table with samples/s and the S3/local ratio.
Targets: train >= 0.95x local (the network hides behind decoding), raw >= 0.7x.

Usage: ``python benchmarks/s3.py --images 5000 --workers 2``
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _data import imagenet_like
from load import transform_for

BATCH = 64


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


def epoch(dest: str, mode: str, workers: int, storage_options: dict | None) -> float:
    """Median samples/s of 3 epochs over ``dest``, after one untimed warm-up epoch.

    The warm-up pays one-time costs (imports, first connections, page cache) that would
    otherwise land on whichever location is measured first.
    """
    import statistics

    from torch.utils.data import DataLoader

    from shardstream.streaming import StreamingDataset, StreamOptions

    dataset = StreamingDataset(
        dest,
        decode="raw" if mode == "raw" else "pil",
        transform=transform_for(mode),
        batch_size=BATCH,
        options=StreamOptions(storage_options=storage_options),
    )
    loader = DataLoader(dataset, batch_size=None, num_workers=workers)
    rates = []
    for number in range(4):
        dataset.set_epoch(number)
        start, count = time.perf_counter(), 0
        for batch in loader:
            count += len(batch[1])
        rates.append(count / (time.perf_counter() - start))
    return statistics.median(rates[1:])


def build(source: Path, dest: str, storage_options: dict | None, workers: int) -> float:
    """Seconds to build ``dest`` from ``source``."""
    from shardstream import build_shards

    start = time.perf_counter()
    build_shards(
        source, dest, storage_options=storage_options, workers=workers,
        max_bytes_per_shard=16 * 2**20,
    )  # fmt: skip
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=["raw", "train"])
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    source = imagenet_like(args.images, num_classes=max(1, args.images // 100))
    with tempfile.TemporaryDirectory() as scratch:
        # Local disk is measured before the S3 server starts: moto keeps working for seconds
        # after an upload and would otherwise slow the local rows down (measured: 12k -> 1.8k/s).
        local = str(Path(scratch) / "train")
        build_s = {"local": build(source, local, None, args.workers)}
        local_rates = {mode: epoch(local, mode, args.workers, None) for mode in args.modes}
    with moto_server() as endpoint:
        import s3fs

        options = {"endpoint_url": endpoint}
        s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir("bench")
        remote = "s3://bench/train"
        build_s["s3"] = build(source, remote, options, args.workers)
        s3_rates = {mode: epoch(remote, mode, args.workers, options) for mode in args.modes}
    rows = [f"| build (s) | {build_s['local']:.1f} | {build_s['s3']:.1f} | "
            f"{build_s['local'] / build_s['s3']:.2f}x |"]  # fmt: skip
    for mode in args.modes:
        rows.append(
            f"| {mode} (samples/s) | {local_rates[mode]:.0f} | {s3_rates[mode]:.0f} | "
            f"{s3_rates[mode] / local_rates[mode]:.2f}x |"
        )
    print(f"\n{args.images} images, {args.workers} workers, batch {BATCH}\n")
    print("| | local disk | S3 (moto, loopback) | S3/local |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
