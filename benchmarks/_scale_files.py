"""The manifest, verify and build rows of benchmarks/scale.py, each in a fresh process."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

MANIFEST_CODE = r"""
import json, sys, time, resource
import psutil
from shardstream._format.manifest import read_manifest, write_manifest
root, out = sys.argv[1:3]
started = time.perf_counter()
manifest = read_manifest(root)
read_s = time.perf_counter() - started
started = time.perf_counter()
write_manifest(out, manifest)
write_s = time.perf_counter() - started
rss = psutil.Process().memory_info().rss / 2**20
print(json.dumps({"read_s": read_s, "write_s": write_s, "rss_mb": rss,
                  "shards": len(manifest.shards), "samples": manifest.num_samples}))
"""

VERIFY_CODE = r"""
import json, sys, time
import psutil
from shardstream._format.manifest import read_manifest
from shardstream._format.verify import check_shard
from shardstream._storage import Store
root, count = sys.argv[1], int(sys.argv[2])
store = Store(root)
manifest = read_manifest(store)
me = psutil.Process()
marks, started = {}, time.perf_counter()
for number, shard in enumerate(manifest.shards):
    if number == count:
        break
    assert not check_shard(store, shard)
    if number + 1 in (count // 10, count):
        marks[number + 1] = me.memory_info().rss / 2**20
elapsed = time.perf_counter() - started
print(json.dumps({"shards_per_s": count / elapsed, "rss_by_shards": marks}))
"""


def run_code(code: str, *args: object, timeout: int = 1800) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_command(*command: str) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    return time.perf_counter() - started


BUILD_CODE = r"""
import json, resource, sys, time
from shardstream import build_shards
dest, count = sys.argv[1], int(sys.argv[2])
samples = ({"__key__": f"k{i:08d}", "cls": i % 10} for i in range(count))
started = time.perf_counter()
manifest = build_shards(samples, dest, max_samples_per_shard=1, workers=1)
print(json.dumps({"seconds": time.perf_counter() - started, "shards": len(manifest.shards),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure_build_resume(folder: Path, count: int) -> dict:
    """A build of ``count`` one-sample shards: whole, then killed half-way and resumed."""
    import shutil
    import signal

    for name in ("whole", "killed"):
        shutil.rmtree(folder / name, ignore_errors=True)
    whole = run_code(BUILD_CODE, folder / "whole", count)
    state = folder / "killed" / "_shardstream_build"
    process = subprocess.Popen(
        [sys.executable, "-c", BUILD_CODE, str(folder / "killed"), str(count)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    while process.poll() is None:
        done = (
            sum(1 for name in os.listdir(state) if name.endswith(".json")) if state.exists() else 0
        )
        if done >= count // 2:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.5)
    process.wait()
    state_files = list(state.iterdir())
    state_bytes = sum(path.stat().st_size for path in state_files if path.suffix == ".json")
    resumed = run_code(BUILD_CODE, folder / "killed", count)
    return {
        "whole": whole, "resumed": resumed, "records_at_kill": done,
        "state_json_bytes": state_bytes, "state_files": len(state_files),
    }  # fmt: skip


def print_manifests(roots: list[Path], args: argparse.Namespace) -> None:
    """Read and write each dataset's manifest; ``inspect`` and ``verify`` the first one."""
    print("\n| manifest | seconds | memory |\n|---|---:|---|")
    for number, root in enumerate(roots):
        copy = args.data / f"manifest-copy-{number}"
        copy.mkdir(parents=True, exist_ok=True)
        manifest = run_code(MANIFEST_CODE, root, copy)
        sidecar = root / "manifest.shards"  # only above 10,000 shards: else inline JSON
        table = (sidecar if sidecar.exists() else root / "manifest.json").stat().st_size
        print(
            f"| read {manifest['shards']:,} shards (table {table / 2**20:.1f} MB) | "
            f"{manifest['read_s']:.2f} | RSS {manifest['rss_mb']:.0f} MB (after write too) |"
        )
        print(f"| write {manifest['shards']:,} shards | {manifest['write_s']:.2f} | |")
    root = roots[0]
    inspect_s = time_command(sys.executable, "-m", "shardstream", "inspect", str(root))
    verify = run_code(VERIFY_CODE, root, args.verify_shards)
    print(f"| `shardstream inspect` ({root.name}) | {inspect_s:.2f} | |")
    marks = ", ".join(
        f"{rss:.0f} MB after {int(n):,}" for n, rss in verify["rss_by_shards"].items()
    )
    print(f"| `verify`: {verify['shards_per_s']:.0f} shards/s | - | RSS {marks} |")


def print_build(args: argparse.Namespace) -> None:
    build = measure_build_resume(args.data / "build", args.build_shards)
    whole, resumed = build["whole"], build["resumed"]
    print(f"\n| build of {args.build_shards:,} one-sample shards | seconds | peak RSS |")
    print("|---|---:|---:|")
    print(f"| uninterrupted | {whole['seconds']:.1f} | {whole['peak_rss_mb']:.0f} MB |")
    print(
        f"| resumed after a kill at {build['records_at_kill']:,} shards | "
        f"{resumed['seconds']:.1f} | {resumed['peak_rss_mb']:.0f} MB |"
    )
    print(
        f"\nbuild state at the kill: {build['state_files']:,} files, "
        f"{build['state_json_bytes'] / 2**20:.1f} MB of records"
    )
