"""Count S3 requests and bytes for one raw epoch read through a counting proxy (moto, loopback).

Builds the ``imagenet_like`` tree to ``s3://bench/train`` directly on moto, then streams one
epoch in raw mode through ``tests/s3/faultproxy.FaultProxy`` (no faults), which counts every
request and the response body bytes. Prints GETs, HEADs, GETs starting at byte 0 and bytes
fetched against the dataset's size.

Usage: ``python benchmarks/s3_requests.py --images 2000 --workers 2``
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT.parent))
from _data import imagenet_like  # noqa: E402
from s3 import BATCH, build, moto_server  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    source = imagenet_like(args.images, num_classes=max(1, args.images // 100))
    from torch.utils.data import DataLoader

    from shardstream._format.manifest import read_manifest
    from shardstream.streaming import StreamingDataset, StreamOptions
    from tests.s3.faultproxy import FaultProxy

    with moto_server() as endpoint:
        import s3fs

        s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir("bench")
        build(source, "s3://bench/train", {"endpoint_url": endpoint}, args.workers)
        host, port = endpoint.rsplit("//", 1)[1].split(":")
        proxy = FaultProxy((host, int(port)))
        try:
            options = {"endpoint_url": proxy.endpoint_url, "skip_instance_cache": True}
            size = read_manifest("s3://bench/train", options).num_bytes
            proxy.clear()
            dataset = StreamingDataset(
                "s3://bench/train", decode="raw", batch_size=BATCH,
                options=StreamOptions(storage_options=options),
            )  # fmt: skip
            loader = DataLoader(dataset, batch_size=None, num_workers=args.workers)
            count = sum(len(batch[1]) for batch in loader)
            gets = [t for m, t in proxy.requests if m == "GET"]
            heads = proxy.count("HEAD")
            print(f"\n{count} samples, {args.workers} workers, dataset {size / 1e6:.1f} MB\n")
            print("| GETs | HEADs | bytes fetched | fetched / dataset |\n|---|---|---|---|")
            print(f"| {len(gets)} | {heads} | {proxy.body_bytes_sent / 1e6:.1f} MB | "
                  f"{proxy.body_bytes_sent / size:.2f}x |")  # fmt: skip
        finally:
            proxy.stop()


if __name__ == "__main__":
    main()
