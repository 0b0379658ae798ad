"""Scale benchmark: what one rank pays at start-up, first batch, resume and elastic restore.

Simulates datasets of ``S`` shards x ``n`` samples without the disk they would need (see
``_scale_data.py``: every shard name a hard link to a copy of one real shard, so planning,
manifests, indexes and reads are real). Per dataset and layout ``W x N`` (ranks x DataLoader
workers), batch 256, raw samples, each measurement in a fresh process (``_scale_rows.py``),
for rank 0 and for the last rank:

- start-up: manifest + ``StreamingDataset`` + ``len``: seconds and RSS over the imports;
- first batch of a fresh epoch with 0 and with ``N`` workers;
- first batch after a same-layout resume, from a state saved half-way through the epoch;
- first batch after elastic restores of that state at other layouts (``--elastic``: by
  default ``3/4 W x 8`` and ``5/4 W x 4``, e.g. 1,024 x 8 -> 768 x 8 and -> 1,280 x 4);
- the state's size, and the memory of the rank and of each of its workers.

Each first batch is given as wall time and as CPU seconds, which a busy machine inflates far
less: the rank's plus its slowest worker's (about the wall time on idle cores; an upper bound,
as workers go on to their next batches), and in all.

Then (unless ``--no-files``) each dataset's manifest read and written, ``inspect`` and
``verify`` of the first one, and (``--build-shards``) a build killed half-way and resumed.

Usage:
    python benchmarks/scale.py                  # 1e6 x 1e4 and 1e7 x 1e3 samples at 1,024 x 8
    python benchmarks/scale.py --sweep ranks    # 8 ... 4,096 ranks x 8 at 1e6 x 1e3
    python benchmarks/scale.py --sweep samples  # 1e6 ... 1e10 samples at 1,024 x 8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _data import DATA_ROOT  # noqa: E402
from _scale_data import simulate  # noqa: E402
from _scale_files import print_build, print_manifests  # noqa: E402

_SAMPLES = "1000x1000 10000x1000 100000x1000 1000000x1000 1000000x10000 10000000x1000"
SWEEPS = {
    "ranks": (["1000000x1000"], ["8x8", "64x8", "512x8", "1024x8", "4096x8"]),
    "samples": (_SAMPLES.split(), ["1024x8"]),
}


def _pair(text: str) -> tuple[int, int]:
    first, second = text.lower().split("x")
    return int(first), int(second)


def elastic_layouts(world: int, specs: list[str]) -> list[tuple[int, int]]:
    """``3/4x8`` at 1,024 ranks is 768 x 8 (at least one rank)."""
    layouts = []
    for spec in specs:
        share, workers = spec.lower().split("x")
        layouts.append((max(1, int(world * Fraction(share))), int(workers)))
    return layouts


def run_row(row: str, root: Path, world: int, workers: int, rank: int, state: Path) -> dict:
    command = [
        sys.executable, str(HERE / "_scale_rows.py"), row, str(root), "--world", str(world),
        "--workers", str(workers), "--rank", str(rank), "--state", str(state),
    ]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    if out.returncode != 0:
        raise RuntimeError(f"{row} at {world}x{workers}, rank {rank} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(root: Path, world: int, workers: int, elastic: list[str], data: Path) -> dict:
    """Every row of one dataset and layout, for rank 0 and the last rank."""
    state = data / f"state-{root.name}-{world}x{workers}.json"
    saved = run_row("save", root, world, workers, 0, state)
    ranks: dict[str, dict] = {}
    for which in ("first", "last"):
        rank = 0 if which == "first" else world - 1
        rows = {
            "startup": run_row("startup", root, world, 0, rank, state),
            "first0": run_row("first", root, world, 0, rank, state),
            f"first{workers}": run_row("first", root, world, workers, rank, state),
            "resume": run_row("resume", root, world, workers, rank, state),
        }
        for new_world, new_workers in elastic_layouts(world, elastic):
            new_rank = 0 if which == "first" else new_world - 1
            rows[f"elastic {new_world}x{new_workers}"] = run_row(
                "resume", root, new_world, new_workers, new_rank, state
            )
        ranks["rank 0" if which == "first" else "last rank"] = rows
    return {"state_bytes": saved["state_bytes"], "batches": saved["batches"], "ranks": ranks}


def print_result(name: str, world: int, workers: int, result: dict) -> None:
    """One table per dataset and layout: a row per measurement, a column per rank."""
    print(
        f"\n{name}, {world:,} ranks x {workers} workers, batch 256, raw; {result['batches']:,} "
        f"batches per rank; state {result['state_bytes']:,} bytes\n"
    )
    ranks = list(result["ranks"])
    print("| measurement | " + " | ".join(ranks) + " |")
    print("|---|" + "---:|" * len(ranks))
    for row in result["ranks"][ranks[0]]:
        cells = []
        for rank in ranks:
            item = result["ranks"][rank][row]
            if row == "startup":
                cells.append(f"{item['startup_s']:.2f} s, +{item['startup_mb']:.0f} MB")
                continue
            cell = (
                f"{item['first_batch_s']:.2f} s ({item.get('critical_cpu_s', 0):.2f} CPU-s; "
                f"{item.get('first_batch_cpu_s', 0):.2f} in all)"
            )
            if item["workers"]:
                cell += (
                    f"; worker PSS {item['worker_pss_mb']:.0f} MB (USS {item['worker_uss_mb']:.0f})"
                )
            cells.append(cell + f"; rank RSS {item['rank_rss_mb']:.0f} MB")
        print(f"| {row} | " + " | ".join(cells) + " |")


def print_summary(everything: dict) -> None:
    """README's form: a column per dataset and layout, a row per measurement in the order of
    the first, each cell the slower of rank 0 and the last rank: wall (rank + slowest worker
    CPU) seconds."""
    print("\n| worst of rank 0 and the last rank | " + " | ".join(everything) + " |")
    print("|---|" + "---:|" * len(everything))
    rows = [list(result["ranks"]["rank 0"]) for result in everything.values()]
    for number, row in enumerate(rows[0]):
        cells = []
        for names, result in zip(rows, everything.values(), strict=True):
            items = [rank[names[number]] for rank in result["ranks"].values()]
            if row == "startup":
                worst = max(items, key=lambda item: item["startup_s"])
                cells.append(f"{worst['startup_s']:.2f} (+{worst['startup_mb']:.0f} MB)")
            else:
                worst = max(items, key=lambda item: item["first_batch_s"])
                cells.append(f"{worst['first_batch_s']:.2f} ({worst.get('critical_cpu_s', 0):.2f})")
        label = row if number < 4 else ", ".join(dict.fromkeys(names[number] for names in rows))
        print(f"| {label} | " + " | ".join(cells) + " |")
    states = " | ".join(f"{result['state_bytes']}" for result in everything.values())
    print(f"| state bytes | {states} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", choices=sorted(SWEEPS), help="a README table's run")
    parser.add_argument("--datasets", default="1000000x10000,10000000x1000",
                        help="shards x samples per shard, comma-separated")  # fmt: skip
    parser.add_argument("--layouts", default="1024x8", help="ranks x workers, comma-separated")
    parser.add_argument("--elastic", default="3/4x8,5/4x4",
                        help="restore layouts: share of the ranks x workers")  # fmt: skip
    parser.add_argument("--no-files", action="store_true", help="skip manifest/verify rows")
    parser.add_argument("--verify-shards", type=int, default=2000)
    parser.add_argument("--build-shards", type=int, default=0, help="0 skips the build rows")
    parser.add_argument("--data", type=Path, default=DATA_ROOT / "scale")
    parser.add_argument("--out", type=Path, help="also write every number as JSON")
    args = parser.parse_args()
    datasets, layouts = args.datasets.split(","), args.layouts.split(",")
    if args.sweep:
        datasets, layouts = SWEEPS[args.sweep]
    everything, roots = {}, []
    for dataset in datasets:
        shards, per_shard = _pair(dataset)
        root, made = simulate(args.data, shards, per_shard)
        roots.append(root)
        if made:
            print(f"simulated {shards:,} shards x {per_shard:,} samples in {made:.0f} s: {root}")
        for layout in layouts:
            world, workers = _pair(layout)
            result = measure(root, world, workers, args.elastic.split(","), args.data)
            name = f"{shards:,} shards x {per_shard:,} = {shards * per_shard:.0e} samples"
            print_result(name, world, workers, result)
            everything[f"{dataset} at {layout}"] = result
    print_summary(everything)
    if args.out:
        args.out.write_text(json.dumps(everything, indent=1))
    if not args.no_files:
        print_manifests(roots, args)
    if args.build_shards:
        print_build(args)


if __name__ == "__main__":
    main()
