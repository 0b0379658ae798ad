"""Cleaning at scale: exclude 1% of a simulated billion samples, then start, read and restore.

Simulates ``--shards`` shards of ``--per-shard`` samples (default 1,000,000 x 1,000) as
``benchmarks/scale.py`` does: one real shard and its index, every other shard name a symbolic
link to them, and a manifest listing every shard. Each row runs in a fresh process:

- ``exclude``: :func:`exclude_samples` of ``--fraction`` (1%) of the samples by position of the
  published version (publishes a version and its ``.excluded`` sidecar); its peak RSS;
- ``exclude-keys``: the same call by ``(shard, key)`` pairs for ``--key-pairs`` samples (reads
  the named shards' indexes);
- on the excluded version, as rank 0 of ``--world`` ranks, raw samples, batch 256: start-up
  (manifest, StreamingDataset, ``len``), the first batch of a fresh epoch with 0 and 8
  workers, and the first batch after an elastic restore (64 x 8 -> 48 x 8) of a state saved
  half-way through the epoch;
- ``dups``: :func:`find_duplicates` over ``--dups-samples`` real samples (64 random bytes
  each, 1% of them copies of others, in shards of 1,000) and a second dataset of a tenth of
  that size holding 100 leaked copies: its time, peak RSS, and that it found every planted
  group;
- ``dups-simulated`` (``--dups-simulated N``): :func:`find_duplicates` on a Dask local
  cluster (2 workers) over N simulated samples: every shard name links to one real shard,
  but each shard has its own index with its own digests (1% of the samples in the first half
  of each shard copy a sample of another shard's second half); its time, the driver's peak
  RSS, and that it found exactly the planted groups;
- ``attach``: :func:`attach_columns` of a Parquet table of one row per sample of that dataset
  (key, a float, a string): its time and peak RSS; then raw samples/s read in-process from
  the version before and the version with the fields (the cost of the fields).

Usage: python benchmarks/clean_scale.py [--shards 1000000] [--per-shard 1000] [--fraction 0.01]
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


def simulate(root: Path, num_shards: int, per_shard: int) -> float:
    """One real shard + index, every other name a link to them; the manifest of version 1."""
    import numpy as np

    from shardstream import build_shards
    from shardstream._format.manifest import Manifest, write_manifest
    from shardstream._format.shardtable import NameColumn, ShardTable

    started = time.perf_counter()
    for path in root.glob("manifest.v*"):  # a run before excluded: back to version 1
        path.unlink()
    real = root / "real"
    if not (real / "manifest.json").exists():
        samples = ({"__key__": f"k{i:07d}", "jpg": bytes(64), "cls": i % 1000}
                   for i in range(per_shard))  # fmt: skip
        build_shards(samples, real, max_samples_per_shard=per_shard, overwrite=True)
    info = json.loads((real / "manifest.json").read_text())["shards"][0]
    root.mkdir(parents=True, exist_ok=True)
    for index in range(num_shards):
        for suffix in ("tar", "idx"):
            link = root / f"shard-{index:06d}.{suffix}"
            if not link.is_symlink():
                os.symlink(real / f"shard-000000.{suffix}", link)
    sha = np.frombuffer(bytes.fromhex(info["sha256"]), np.uint8)
    table = ShardTable(
        NameColumn(num_shards, ("shard-", 6, ".tar", 0)),
        np.full(num_shards, info["num_samples"], np.int64),
        np.full(num_shards, info["num_bytes"], np.int64),
        np.broadcast_to(sha, (num_shards, 32)).copy(),
        NameColumn(num_shards, ("shard-", 6, ".idx", 0)),
    )
    write_manifest(root, Manifest(shards=table, created_by="benchmarks/clean_scale.py"))
    return time.perf_counter() - started


EXCLUDE_CODE = r"""
import json, resource, sys, time
import numpy as np
from shardstream._catalog.exclude import exclude_samples
from shardstream._format.manifest import read_manifest
root, how, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
total = read_manifest(root).num_samples
rng = np.random.default_rng(0)
started = time.perf_counter()
if how == "positions":
    manifest = exclude_samples(root, positions=np.unique(rng.integers(0, total, count)))
else:  # (shard, key) pairs: the simulated shards all hold keys k0000000 ..
    places = np.unique(rng.integers(0, total, count))
    pairs = [(f"shard-{p // 1000:06d}.tar", f"k{p % 1000:07d}") for p in places.tolist()]
    started = time.perf_counter()
    manifest = exclude_samples(root, shard_keys=pairs)
seconds = time.perf_counter() - started
sidecar = manifest.exclusions.encoded if manifest.exclusions is not None else b""
print(json.dumps({"seconds": seconds, "version": manifest.version,
                  "excluded": len(manifest.exclusions or ()), "sidecar_mb": len(sidecar) / 2**20,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

ROW_CODE = r"""
import json, sys, time, warnings
warnings.filterwarnings("ignore", message="This DataLoader will create")
import psutil, torch
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
row, root, world, workers, state_path = sys.argv[1:6]
started = time.perf_counter()
options = StreamOptions(rank=0, world_size=int(world))
ds = StreamingDataset(root, decode="raw", batch_size=256, options=options)
result = {"startup_s": time.perf_counter() - started, "batches": len(ds), "version": ds.version,
          "rss_mb": psutil.Process().memory_info().rss / 2**20}
if row == "state":
    loader = StreamingDataLoader(ds, num_workers=int(workers))
    state = loader.state_dict()
    state["consumed_batches"] = len(loader) // 2
    open(state_path, "w").write(json.dumps(state))
elif row != "startup":
    loader = StreamingDataLoader(ds, num_workers=int(workers))
    started = time.perf_counter()
    if row == "elastic":
        loader.load_state_dict(json.load(open(state_path)))
    batch = next(iter(loader))
    result["first_batch_s"] = time.perf_counter() - started
    result["batch_len"] = len(batch[0])
print(json.dumps(result))
"""


def run_code(code: str, *args: object, timeout: int = 1800) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
        timeout=timeout,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


DUPS_BUILD = r"""
import sys
import numpy as np
from shardstream import build_shards
root, count = sys.argv[1], int(sys.argv[2])
rng = np.random.default_rng(0)
payload = rng.integers(0, 256, (count, 64), dtype=np.uint8)
copies = rng.choice(count, count // 100, replace=False)  # 1% copies of a random other sample
payload[copies] = payload[rng.integers(0, count, len(copies))]
build_shards(({"__key__": f"t{i:08d}", "bin": payload[i].tobytes()} for i in range(count)),
             root + "/train", max_samples_per_shard=1000, overwrite=True)
other = rng.integers(0, 256, (count // 10, 64), dtype=np.uint8)
other[:100] = payload[rng.choice(count, 100, replace=False)]  # 100 leaks from train
build_shards(({"__key__": f"v{i:08d}", "bin": other[i].tobytes()} for i in range(len(other))),
             root + "/test", max_samples_per_shard=1000, overwrite=True)
np.save(root + "/payload.npy", payload)
np.save(root + "/other.npy", other)
"""

DUPS_CODE = r"""
import json, resource, sys, time
import numpy as np
from shardstream._catalog.dups import find_duplicates
root = sys.argv[1]
started = time.perf_counter()
report = find_duplicates([root + "/train", root + "/test"], keys_out=root + "/keys.txt")
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # before the check below
payload, other = np.load(root + "/payload.npy"), np.load(root + "/other.npy")
rows = np.concatenate([payload, other]).view("V64").ravel()
_, counts = np.unique(rows, return_counts=True)
print(json.dumps({"seconds": seconds, "groups": report.groups, "expected": int((counts > 1).sum()),
                  "crossing": report.crossing_groups, "keys": report.keys_written,
                  "peak_rss_mb": peak}))
"""


ATTACH_CODE = r"""
import json, resource, sys, time
import numpy as np, pyarrow as pa, pyarrow.parquet as pq
from shardstream._catalog.attach import attach_columns
from shardstream._format.manifest import read_manifest
root = sys.argv[1]
import os, pathlib, shutil
train = pathlib.Path(root, "train")
if (train / "manifest.v000001.json").exists():  # a run before attached: back to version 1
    os.replace(train / "manifest.v000001.json", train / "manifest.json")
    for path in train.glob("manifest.v*"):
        path.unlink()
    shutil.rmtree(train / "columns", ignore_errors=True)
count = read_manifest(root + "/train").num_samples
keys = [f"t{i:08d}" for i in range(count)]
table = pa.table({"__key__": keys, "aesthetic": np.random.default_rng(0).random(count),
                  "caption": [f"a caption of {key}" for key in keys]})
pq.write_table(table, root + "/fields.parquet")
del table, keys
started = time.perf_counter()
manifest = attach_columns(root + "/train", root + "/fields.parquet")
print(json.dumps({"seconds": time.perf_counter() - started, "version": manifest.version,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

READ_CODE = r"""
import json, sys, time
from shardstream.streaming import StreamingDataset, StreamOptions
root, version = sys.argv[1], int(sys.argv[2])
ds = StreamingDataset(root + "/train", decode="raw", batch_size=256, version=version,
                      options=StreamOptions(output="dict"))
started, samples = time.perf_counter(), 0
for batch in ds:
    samples += len(batch["__key__"])
    if samples >= 300_000:
        break
print(json.dumps({"samples_per_s": samples / (time.perf_counter() - started),
                  "fields": "aesthetic" in batch}))
"""


SIM_BUILD = r"""
import json, os, sys
import numpy as np
from shardstream._format.manifest import Manifest, write_manifest
from shardstream._format.shardindex import decode_index, encode_offsets
from shardstream._format.shardtable import NameColumn, ShardTable
real, root, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
info = json.loads(open(real + "/manifest.json").read())["shards"][0]
per = info["num_samples"]
index = decode_index(open(real + "/" + info["index"], "rb").read(), "real")
shards = count // per
os.makedirs(root, exist_ok=True)

def digests(shard, positions):  # two splitmix64 words per (shard, position)
    x = (np.uint64(shard) * np.uint64(per) + positions.astype(np.uint64)) * np.uint64(2)
    words = []
    for word in (x, x + np.uint64(1)):
        z = word + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        words.append(z ^ (z >> np.uint64(31)))
    return np.stack(words, axis=1).view(np.uint8).reshape(-1, 16)

rng = np.random.default_rng(0)
targets = set()
with np.errstate(over="ignore"):
    for shard in range(shards):
        table = digests(shard, np.arange(per))
        copies = rng.random(per // 2) < 0.02  # 1% of the shard: in its first half
        copy_at = np.flatnonzero(copies)
        source_shard = rng.integers(0, shards, len(copy_at))
        source_pos = rng.integers(per // 2, per, len(copy_at))
        chosen = zip(copy_at.tolist(), source_shard.tolist(), source_pos.tolist())
        for position, other, at in chosen:
            table[position] = digests(other, np.array([at]))[0]
            targets.add((other, at))
        name = f"{root}/shard-{shard:07d}"
        with open(name + ".idx", "wb") as out:
            out.write(encode_offsets(index.offsets, index.key_hashes, table.tobytes()))
        if not os.path.islink(name + ".tar"):
            os.symlink(os.path.abspath(real + "/" + info["name"]), name + ".tar")
table = ShardTable(NameColumn(shards, ("shard-", 7, ".tar", 0)), np.full(shards, per, np.int64),
                   np.full(shards, info["num_bytes"], np.int64), None,
                   NameColumn(shards, ("shard-", 7, ".idx", 0)))
write_manifest(root, Manifest(shards=table, created_by="benchmarks/clean_scale.py"))
open(root + "/expected.json", "w").write(json.dumps({"groups": len(targets)}))
print(json.dumps({"shards": shards, "groups": len(targets)}))
"""

SIM_RUN = r"""
import json, resource, sys, time, warnings
warnings.filterwarnings("ignore")
import distributed
from shardstream._catalog.dups import find_duplicates
root, work = sys.argv[1], sys.argv[2]
cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                   dashboard_address=None)
with cluster, distributed.Client(cluster) as client:
    started = time.perf_counter()
    report = find_duplicates([root], executor=client.get_executor(), workers=2, work_dir=work)
    seconds = time.perf_counter() - started
    worker_rss = client.run(lambda: __import__("resource").getrusage(
        __import__("resource").RUSAGE_SELF).ru_maxrss / 1024)
expected = json.load(open(root + "/expected.json"))["groups"]
print(json.dumps({"seconds": seconds, "groups": report.groups, "expected": expected,
                  "samples": report.datasets[0]["samples"],
                  "driver_peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "worker_peak_rss_mb": sorted(worker_rss.values())}))
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", type=int, default=1_000_000, help="0 skips exclude rows")
    parser.add_argument("--per-shard", type=int, default=1000)
    parser.add_argument("--fraction", type=float, default=0.01)
    parser.add_argument("--key-pairs", type=int, default=1_000_000)
    parser.add_argument("--world", type=int, default=64)
    parser.add_argument("--dups-samples", type=int, default=1_000_000, help="0 skips dups")
    parser.add_argument("--no-attach", dest="attach", action="store_false")
    parser.add_argument(
        "--dups-simulated",
        type=int,
        default=0,
        metavar="N",
        help="samples of the simulated dups row on Dask (e.g. 100000000)",
    )
    parser.add_argument("--data", type=Path, default=DATA_ROOT / "clean-scale")
    args = parser.parse_args()
    if args.dups_samples:
        folder = args.data / f"dups-{args.dups_samples}"
        if not (folder / "other.npy").exists():
            run_code(DUPS_BUILD + "print(0)", folder, args.dups_samples, timeout=7200)
        print(json.dumps({"dups": run_code(DUPS_CODE, folder)}, indent=1))
        if args.attach:
            attach = run_code(ATTACH_CODE, folder)
            reads = {f"read_v{v}": run_code(READ_CODE, folder, v)
                     for v in (attach["version"] - 1, attach["version"])}  # fmt: skip
            print(json.dumps({"attach": attach, **reads}, indent=1))
    if args.dups_simulated:
        real = args.data / f"dups-{args.dups_samples or 1_000_000}" / "train"
        sim = args.data / f"dups-sim-{args.dups_simulated}"
        if not (sim / "expected.json").exists():
            run_code(SIM_BUILD, real, sim, args.dups_simulated, timeout=7200)
        work = args.data / "dups-work"
        print(json.dumps({"dups-simulated": run_code(SIM_RUN, sim, work, timeout=7200)}, indent=1))
    if not args.shards:
        return
    root = args.data / f"sim-{args.shards}x{args.per_shard}"
    made = simulate(root, args.shards, args.per_shard)
    total = args.shards * args.per_shard
    print(f"simulated {args.shards:,} shards x {args.per_shard:,} in {made:.0f} s: {root}")
    count = int(total * args.fraction)
    rows = {"exclude": run_code(EXCLUDE_CODE, root, "positions", count)}
    if args.key_pairs:
        rows["exclude-keys"] = run_code(EXCLUDE_CODE, root, "pairs", args.key_pairs)
    state = args.data / "state.json"
    run_code(ROW_CODE, "state", root, args.world, 8, state)
    rows["startup"] = run_code(ROW_CODE, "startup", root, args.world, 0, state)
    rows["first0"] = run_code(ROW_CODE, "first", root, args.world, 0, state)
    rows["first8"] = run_code(ROW_CODE, "first", root, args.world, 8, state)
    rows["elastic"] = run_code(ROW_CODE, "elastic", root, args.world * 3 // 4, 8, state)
    print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
