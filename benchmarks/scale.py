"""Scale benchmark: start-up, first batches, restores and manifests at a billion samples.

Simulates a dataset of ``--shards`` shards of ``--per-shard`` samples (default 1,000,000 x 1,000)
without the disk it would need: one real shard and its index are built, and every other shard
name is a symbolic link to them, so planning, manifests and reading are real while the bytes
are shared. The manifest lists every shard (the binary shard table). Each row runs in a fresh
process, as rank 0 of ``--world`` ranks, raw samples, batch 256:

- start-up: read the manifest, build the StreamingDataset, ``len()``; its RSS;
- first batch of a fresh epoch with 0 and with 8 DataLoader workers; PSS of the rank and its
  workers (pages the workers share with it count once);
- first batch after a same-layout resume and an elastic restore (64 x 8 -> 48 x 8), both from
  a state saved half-way through the epoch; the state's size;
- the manifest written, read, ``shardstream inspect`` and ``verify`` (its memory over the first
  shards: verify re-reads every byte, so at this size it is bound by bytes, not by memory);
- a manifest of ``--huge`` (10,000,000) shards written and read;
- a build of ``--build-shards`` one-sample shards killed half-way and resumed: the resume's time,
  memory and build-state size, against the uninterrupted build.

Usage: python benchmarks/scale.py [--shards 1000000] [--per-shard 1000] [--world 64]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _data import DATA_ROOT  # noqa: E402

ROWS_TEXT = {
    "startup": "start-up: manifest + StreamingDataset + len",
    "first0": "first batch, fresh epoch, 0 workers",
    "first8": "first batch, fresh epoch, 8 workers",
    "resume": "first batch after a same-layout resume (64x8, half-way)",
    "elastic": "first batch after an elastic restore (64x8 -> 48x8, half-way)",
}


def build_simulation(root: Path, num_shards: int, per_shard: int) -> float:
    """One real shard + index, every other name a link to them, and a format-2 manifest."""
    import numpy as np

    from shardstream import build_shards
    from shardstream.format.manifest import Manifest, write_manifest
    from shardstream.format.shardtable import NameColumn, ShardTable

    started = time.perf_counter()
    marker = root / "manifest.json"
    if marker.exists() and json.loads(marker.read_text()).get("num_shards") == num_shards:
        return 0.0
    real = root / "real"
    samples = (
        {"__key__": f"k{i:07d}", "jpg": bytes(64), "cls": i % 1000} for i in range(per_shard)
    )
    built = build_shards(samples, real, max_samples_per_shard=per_shard, overwrite=True)
    info = built.shards[0]
    root.mkdir(parents=True, exist_ok=True)
    for index in range(num_shards):
        for suffix in ("tar", "idx"):
            link = root / f"shard-{index:06d}.{suffix}"
            if not link.is_symlink():
                os.symlink(real / f"shard-000000.{suffix}", link)
    count = num_shards
    sha = np.frombuffer(bytes.fromhex(info.sha256 or "0" * 64), np.uint8)
    table = ShardTable(
        NameColumn(count, ("shard-", 6, ".tar", 0)),
        np.full(count, info.num_samples, np.int64),
        np.full(count, info.num_bytes, np.int64),
        np.broadcast_to(sha, (count, 32)).copy(),
        NameColumn(count, ("shard-", 6, ".idx", 0)),
    )
    write_manifest(root, Manifest(shards=table, created_by="benchmarks/scale.py"))
    return time.perf_counter() - started


ROW_CODE = r"""
import json, os, sys, time, warnings
warnings.filterwarnings("ignore", message="This DataLoader will create")
start_import = time.perf_counter()
import torch
import psutil
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
imported = time.perf_counter() - start_import
row, root, world, workers, state_path = sys.argv[1:6]
world, workers = int(world), int(workers)
before = psutil.Process().memory_info().rss
started = time.perf_counter()
options = StreamOptions(rank=0, world_size=world)
ds = StreamingDataset(root, decode="raw", batch_size=256, options=options)
length = len(ds)
startup = time.perf_counter() - started
after = psutil.Process().memory_info().rss
result = {"import_s": imported, "startup_s": startup, "batches_per_epoch": length,
          "startup_rss_mb": after / 2**20, "dataset_mb": (after - before) / 2**20}
if row != "startup":
    loader = StreamingDataLoader(ds, num_workers=workers)
    if row in ("resume", "elastic"):
        with open(state_path) as stream:
            state = json.load(stream)
        result["state_bytes"] = len(json.dumps(state))
        started = time.perf_counter()
        loader.load_state_dict(state)
    else:
        started = time.perf_counter()
    batches = iter(loader)  # kept: its workers stay alive for the memory measurement
    batch = next(batches)
    result["first_batch_s"] = time.perf_counter() - started
    result["batch_len"] = len(batch[0])
    me = psutil.Process()
    processes = [me, *me.children(recursive=True)]
    result["pss_mb"] = sum(p.memory_full_info().pss for p in processes) / 2**20
    result["rss_mb"] = sum(p.memory_info().rss for p in processes) / 2**20
    result["processes"] = len(processes)
print(json.dumps(result))
"""


def run_row(row: str, root: Path, world: int, workers: int, state: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", ROW_CODE, row, str(root), str(world), str(workers), str(state)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"{row} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def half_way_state(root: Path, world: int, workers: int, path: Path) -> int:
    """A loader state of rank 0 at ``world`` x ``workers``, half-way through epoch 0."""
    from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions

    options = StreamOptions(rank=0, world_size=world)
    loader = StreamingDataLoader(
        StreamingDataset(root, decode="raw", batch_size=256, options=options), num_workers=workers
    )
    state = loader.state_dict()
    state["consumed_batches"] = len(loader) // 2  # what the loader says after that many batches
    path.write_text(json.dumps(state))
    return len(loader)


MANIFEST_CODE = r"""
import json, sys, time, resource
import psutil
from shardstream.format.manifest import read_manifest, write_manifest
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
from shardstream.format.manifest import read_manifest
from shardstream.format.verify import check_shard
from shardstream.storage import Store
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

HUGE_CODE = r"""
import json, sys, time
import numpy as np, psutil
from shardstream.format.manifest import Manifest, read_manifest, write_manifest
from shardstream.format.shardtable import NameColumn, ShardTable
root, count = sys.argv[1], int(sys.argv[2])
table = ShardTable(NameColumn(count, ("shard-", 8, ".tar", 0)), np.full(count, 1000, np.int64),
                   np.full(count, 10**8, np.int64), np.zeros((count, 32), np.uint8),
                   NameColumn(count, ("shard-", 8, ".idx", 0)))
started = time.perf_counter()
write_manifest(root, Manifest(shards=table))
write_s = time.perf_counter() - started
del table
started = time.perf_counter()
manifest = read_manifest(root)
total = manifest.num_samples
last = manifest.shards[-1].name
read_s = time.perf_counter() - started
print(json.dumps({"write_s": write_s, "read_s": read_s, "samples": total, "last": last,
                  "rss_mb": psutil.Process().memory_info().rss / 2**20}))
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1_000_000)
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--world", type=int, default=64)
    parser.add_argument("--huge", type=int, default=10_000_000)
    parser.add_argument("--verify-shards", type=int, default=2000)
    parser.add_argument("--build-shards", type=int, default=100_000, help="0 skips the build rows")
    parser.add_argument("--data", type=Path, default=DATA_ROOT / "scale")
    args = parser.parse_args()
    root = args.data / f"sim-{args.shards}x{args.per_shard}"
    made = build_simulation(root, args.shards, args.per_shard)
    print(f"simulated {args.shards} shards x {args.per_shard} samples in {made:.0f} s: {root}")
    state_path = args.data / "state-64x8.json"
    half_way_state(root, args.world, 8, state_path)
    results = {
        "startup": run_row("startup", root, args.world, 0, state_path),
        "first0": run_row("first0", root, args.world, 0, state_path),
        "first8": run_row("first8", root, args.world, 8, state_path),
        "resume": run_row("resume", root, args.world, 8, state_path),
        "elastic": run_row("elastic", root, args.world * 3 // 4, 8, state_path),
    }
    print_loading(results, args)
    print_manifests(root, args)
    if args.build_shards:  # 0 skips the (slow) build rows
        print_build(args)


def print_loading(results: dict, args: argparse.Namespace) -> None:
    samples = args.shards * args.per_shard
    print(f"\n{args.shards:,} shards x {args.per_shard:,} = {samples:,} samples; rank 0 of "
          f"{args.world}; batch 256, raw; torch import "
          f"{results['startup']['import_s']:.1f} s (not counted)\n")  # fmt: skip
    print("| measurement | seconds | memory |")
    print("|---|---:|---|")
    startup = results["startup"]
    memory = f"+{startup['dataset_mb']:.0f} MB RSS (process {startup['startup_rss_mb']:.0f} MB)"
    print(f"| {ROWS_TEXT['startup']} | {startup['startup_s']:.2f} | {memory} |")
    for row in ("first0", "first8", "resume", "elastic"):
        item = results[row]
        memory = f"PSS {item['pss_mb']:.0f} MB over {item['processes']} processes"
        if "state_bytes" in item:
            memory += f"; state {item['state_bytes']:,} bytes"
        print(f"| {ROWS_TEXT[row]} | {item['first_batch_s']:.2f} | {memory} |")


def print_manifests(root: Path, args: argparse.Namespace) -> None:
    copy = args.data / "manifest-copy"
    copy.mkdir(parents=True, exist_ok=True)
    manifest = run_code(MANIFEST_CODE, root, copy)
    inspect_s = time_command(sys.executable, "-m", "shardstream.cli", "inspect", str(root))
    verify = run_code(VERIFY_CODE, root, args.verify_shards)
    huge_root = args.data / f"huge-{args.huge}"
    huge_root.mkdir(parents=True, exist_ok=True)
    huge = run_code(HUGE_CODE, huge_root, args.huge)
    sidecar = root / "manifest.shards"  # only above 10,000 shards: else inline JSON
    table = (sidecar if sidecar.exists() else root / "manifest.json").stat().st_size
    print("\n| manifest | seconds | memory |\n|---|---:|---|")
    print(
        f"| read {manifest['shards']:,} shards (table {table / 2**20:.1f} MB) | "
        f"{manifest['read_s']:.2f} | RSS {manifest['rss_mb']:.0f} MB (after write too) |"
    )
    print(f"| write {manifest['shards']:,} shards | {manifest['write_s']:.2f} | |")
    print(f"| `shardstream inspect` | {inspect_s:.2f} | |")
    marks = ", ".join(
        f"{rss:.0f} MB after {int(n):,}" for n, rss in verify["rss_by_shards"].items()
    )
    print(f"| `verify`: {verify['shards_per_s']:.0f} shards/s | - | RSS {marks} |")
    print(f"| write {args.huge:,} shards | {huge['write_s']:.2f} | |")
    print(f"| read {args.huge:,} shards | {huge['read_s']:.2f} | RSS {huge['rss_mb']:.0f} MB |")


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


if __name__ == "__main__":
    main()
