"""Run Ceph's radosgw (a real S3 server) on 127.0.0.1 for the length of a ``with`` block.

    from s3server.server import radosgw, make_bucket
    with radosgw() as info:           # installs the packages first if needed (root)
        s3 = make_bucket(info, "bench")  # a boto3 client for the server
        s3.put_object(Bucket="bench", Key="k", Body=b"...")

``info`` is the JSON that ``radosgw.sh start`` prints: ``endpoint_url``,
``aws_access_key_id``, ``aws_secret_access_key``, ``region`` and ``dir``. The cluster is
stopped and its folder removed on leaving the block, also on an exception or Ctrl-C.

Run as a script, it starts the server, proves a 64 MiB round trip, and measures whole-object
GET speed with one thread and with 4 threads (the server's ceiling for a Python client on
this machine), then stops it:

    /work/main/.venv/bin/python benchmarks/s3server/server.py
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

SCRIPT = Path(__file__).resolve().with_name("radosgw.sh")
# radosgw.sh's exit status for "DIR already has a running cluster": not ours to stop.
EXIT_ALREADY_RUNNING = 4
# Each daemon gets radosgw.sh's own 120 s; this only guards against a wedged script.
START_TIMEOUT_S = 600
STOP_TIMEOUT_S = 120
MIB = 2**20


def _script(*args: str, timeout: float, capture: bool = False) -> subprocess.CompletedProcess:
    # stderr is left on ours, so the script's progress and error messages are seen as they
    # come; only stdout (the JSON of `start`) is captured.
    return subprocess.run(
        ["bash", str(SCRIPT), *args],
        stdout=subprocess.PIPE if capture else None,
        text=True,
        timeout=timeout,
        check=False,
    )


def install() -> None:
    """Install the Ceph packages with ``radosgw.sh install``, unless already there."""
    if all(shutil.which(tool) for tool in ("ceph-mon", "ceph-osd", "radosgw", "ceph")):
        return
    done = _script("install", timeout=START_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{SCRIPT} install failed (exit {done.returncode}); see above")


def _stop(dir_args: list[str]) -> None:
    done = _script("stop", *dir_args, timeout=STOP_TIMEOUT_S)
    if done.returncode != 0:
        print(
            f"warning: {SCRIPT} stop {' '.join(dir_args)} failed (exit {done.returncode}); "
            "check `pgrep -a ceph; pgrep -a radosgw`",
            file=sys.stderr,
        )


@contextlib.contextmanager
def radosgw(dir: str | os.PathLike[str] | None = None) -> Iterator[dict[str, str]]:
    """Start radosgw (state under ``dir``, default radosgw.sh's), yield its endpoint and keys."""
    install()
    dir_args = [os.fspath(dir)] if dir is not None else []
    try:
        started = _script("start", *dir_args, timeout=START_TIMEOUT_S, capture=True)
    except BaseException:
        # Interrupted (Ctrl-C, timeout) half-way: the daemons run in their own sessions and
        # outlive the script, so stop whatever it had started.
        _stop(dir_args)
        raise
    if started.returncode != 0:
        # The script has already stopped its daemons and kept the folder for its logs, or
        # (exit 4) found someone else's running cluster there, which is not ours to stop.
        raise RuntimeError(
            f"{SCRIPT} start {' '.join(dir_args)} failed "
            f"(exit {started.returncode}); its messages and log paths are above"
        )
    try:
        lines = started.stdout.strip().splitlines()
        info: dict[str, str] = json.loads(lines[-1])
        yield info
    finally:
        _stop(dir_args)


def client(info: dict[str, str]) -> Any:
    """A boto3 S3 client for the server described by ``info``."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=info["endpoint_url"],
        aws_access_key_id=info["aws_access_key_id"],
        aws_secret_access_key=info["aws_secret_access_key"],
        region_name=info["region"],
        # Path-style: virtual-host style would need DNS for BUCKET.127.0.0.1.
        config=Config(
            s3={"addressing_style": "path"}, max_pool_connections=16, retries={"max_attempts": 3}
        ),
    )


def make_bucket(info: dict[str, str], name: str) -> Any:
    """Create bucket ``name`` (fine if it is already ours); return a boto3 client."""
    s3 = client(info)
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=name)
    return s3


def daemon_rss_mib(info: dict[str, str]) -> dict[str, float]:
    """Resident memory (MiB) of each daemon, from the pid files under the cluster's folder."""
    rss = {}
    for name in ("mon", "osd", "rgw"):
        pid = Path(info["dir"], "run", f"{name}.pid").read_text().strip()
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                rss[name] = int(line.split()[1]) / 1024
    return rss


def _get_all(s3: Any, bucket: str, keys: list[str], threads: int) -> tuple[int, float]:
    """GET every key whole, on ``threads`` threads; return (bytes, seconds)."""

    def get(key: str) -> int:
        return len(s3.get_object(Bucket=bucket, Key=key)["Body"].read())

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        total = sum(pool.map(get, keys))
    return total, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="cluster state folder (default: radosgw.sh's)")
    parser.add_argument("--objects", type=int, default=8, help="objects to GET (default 8)")
    parser.add_argument("--size-mib", type=int, default=64, help="object size (default 64)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=2,
        help="times each object is read per measurement (default 2)",
    )
    args = parser.parse_args()
    size = args.size_mib * MIB
    bucket = "bench"

    t0 = time.perf_counter()
    with radosgw(args.dir) as info:
        print(f"started in {time.perf_counter() - t0:.1f} s: {info['endpoint_url']}")
        s3 = make_bucket(info, bucket)

        # Round trip: one object up and back, byte for byte.
        data = os.urandom(size)
        start = time.perf_counter()
        s3.put_object(Bucket=bucket, Key="roundtrip", Body=data)
        put_s = time.perf_counter() - start
        back = s3.get_object(Bucket=bucket, Key="roundtrip")["Body"].read()
        if hashlib.sha256(back).digest() != hashlib.sha256(data).digest():
            raise SystemExit(f"round trip failed: sent {len(data)} bytes, got {len(back)} back")
        print(f"round trip of {args.size_mib} MiB ok (PUT {size / 1e6 / put_s:.0f} MB/s)")

        # Distinct random contents per object, so no layer can serve one from another.
        keys = [f"obj-{i}" for i in range(args.objects)]
        bodies = [os.urandom(size) for _ in keys]
        start = time.perf_counter()
        for key, body in zip(keys, bodies, strict=True):
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        put_s = time.perf_counter() - start
        print(
            f"PUT of {len(keys)} x {args.size_mib} MiB, one thread: "
            f"{len(keys) * size / 1e6 / put_s:.0f} MB/s"
        )
        del bodies
        _get_all(s3, bucket, keys, 4)  # warm-up: connections, and whatever the OSD caches

        work = keys * args.rounds
        print(f"\nwhole-object GETs, {len(work)} x {args.size_mib} MiB, MB = 10^6 bytes")
        print("| threads | MB/s | seconds |")
        print("| --- | --- | --- |")
        for threads in (1, 4):
            total, seconds = _get_all(s3, bucket, work, threads)
            print(f"| {threads} | {total / 1e6 / seconds:,.0f} | {seconds:.2f} |")

        rss = daemon_rss_mib(info)
        print(
            "\ndaemon RSS (MiB): "
            + ", ".join(f"{k} {v:.0f}" for k, v in rss.items())
            + f", total {sum(rss.values()):.0f}"
        )


if __name__ == "__main__":
    main()
