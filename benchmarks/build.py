"""Shard-building benchmark: shardstream vs mosaic-streaming's MDSWriter, webdataset's
ShardWriter and GNU tar, plus scaling.

Builds one ImageFolder tree of realistic JPEGs (default 20,000 images, 100 classes) with
shardstream (1 and 2 workers), ``streaming.MDSWriter`` (one process, as its docs write: the
``jpeg`` bytes and an ``int`` label per sample; the row is left out when mosaicml-streaming is
not installed), ``webdataset.ShardWriter`` and ``tar cf`` (the raw packing limit), then scans +
builds a tree of many tiny files (default 1,000,000) for time and peak RSS.
Every row runs in a fresh child process so that its peak RSS is its own; the tree is read once
beforehand so that every row reads from the page cache. Prints a markdown table.

Usage: python benchmarks/build.py [--num-images 20000] [--tiny-files 1000000] [--skip-scaling]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _data import DATA_ROOT, imagenet_like, tiny_tree

ROWS = ("tar", "webdataset", "mosaic", "shardstream-1", "shardstream-2")


def run_row(row: str, root: Path, out: Path) -> dict:
    """Run one row in this process and return its measurements."""
    start = time.perf_counter()
    if row == "tar":
        subprocess.run(["tar", "cf", str(out / "all.tar"), "-C", str(root), "."], check=True)
    elif row == "webdataset":
        _webdataset_writer(root, out)
    elif row == "mosaic":
        _mosaic_writer(root, out)
    elif row == "plan":
        return {**_plan(root), "seconds": time.perf_counter() - start,
                "rss_mb": _own_peak_kib() / 1024}  # fmt: skip
    else:
        from shardstream import build_shards

        workers = int(row.rsplit("-", 1)[1]) if row.startswith("shardstream-") else 1
        build_shards(root, out, workers=workers, max_bytes_per_shard=256 * 10**6)
    seconds = time.perf_counter() - start
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return {"seconds": seconds, "rss_mb": _own_peak_kib() / 1024, "child_rss_mb": children / 1024}


def _plan(root: Path) -> dict:
    """Scan a tree and plan its shards (what a build holds before it writes): the listing's
    size per file and the process's memory after the imports."""
    from shardstream.shardwriter._sources import scan_source
    from shardstream.shardwriter._state import plan_chunks
    from shardstream.shardwriter._tasks import BuildOptions

    with open("/proc/self/statm") as statm:
        imported_mb = int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    table = scan_source(root).table
    chunks = plan_chunks(table, BuildOptions(max_bytes_per_shard=256 * 10**6))
    arrays = (table.offsets, table.labels, table.sizes)
    table_bytes = len(table.paths) + sum(array.nbytes for array in arrays)
    return {"files": len(table), "chunks": len(chunks), "table_bytes": table_bytes,
            "imported_mb": imported_mb}  # fmt: skip


def _own_peak_kib() -> int:
    """This process's peak RSS in KiB. Linux carries ``ru_maxrss`` across fork and exec, so a
    row started by the benchmark's (large) process would report that process's size: the
    memory map's own high-water mark (``VmHWM``, fresh at exec) is read instead."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _webdataset_writer(root: Path, out: Path) -> None:
    import webdataset as wds

    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    with wds.ShardWriter(str(out / "shard-%06d.tar"), maxsize=256 * 10**6, verbose=0) as sink:
        for label, name in enumerate(classes):
            for folder, _, files in sorted(os.walk(root / name)):
                for file in sorted(files):
                    path = Path(folder) / file
                    key = str(path.relative_to(root).with_suffix(""))
                    sink.write({"__key__": key, "jpg": path.read_bytes(), "cls": label})


def _mosaic_writer(root: Path, out: Path) -> None:
    from streaming import MDSWriter

    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    columns = {"jpg": "bytes", "cls": "int"}
    with MDSWriter(out=str(out / "mds"), columns=columns, size_limit=256 * 10**6) as writer:
        for label, name in enumerate(classes):
            for folder, _, files in sorted(os.walk(root / name)):
                for file in sorted(files):
                    writer.write({"jpg": (Path(folder) / file).read_bytes(), "cls": label})


def _has_mosaic() -> bool:
    try:
        import streaming  # noqa: F401
    except ImportError:
        return False
    return True


def _child(row: str, root: Path, out: Path) -> dict:
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    command = [sys.executable, __file__, "--row", row, "--root", str(root), "--out", str(out)]
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    shutil.rmtree(out)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _tree_stats(root: Path) -> tuple[int, int]:
    count = size = 0
    for folder, _, files in os.walk(root):
        for file in files:
            if not file.startswith("."):
                count += 1
                size += os.path.getsize(os.path.join(folder, file))
    return count, size


def _warm(root: Path) -> None:
    for folder, _, files in os.walk(root):
        for file in files:
            with open(os.path.join(folder, file), "rb") as stream:
                stream.read()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-images", type=int, default=20_000)
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--tiny-files", type=int, default=1_000_000)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows to run")
    parser.add_argument("--skip-scaling", action="store_true")
    parser.add_argument("--scaling-only", action="store_true", help="only the tiny-file rows")
    parser.add_argument("--row", help=argparse.SUPPRESS)
    parser.add_argument("--root", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.row:
        print(json.dumps(run_row(args.row, Path(args.root), Path(args.out))))
        return
    out = DATA_ROOT / "bench-out"
    if not args.scaling_only:
        root = imagenet_like(args.num_images, args.num_classes)
        count, size = _tree_stats(root)
        _warm(root)
        rows = [row for row in args.rows.split(",") if row and (row != "mosaic" or _has_mosaic())]
        results = {row: _child(row, root, out) for row in rows}
        _print_table(results, count, size)
    if not args.skip_scaling:
        _print_scaling(tiny_tree(args.tiny_files), args.tiny_files, out)


def _print_scaling(tiny: Path, count: int, out: Path) -> None:
    _warm(tiny)
    plan = _child("plan", tiny, out)
    print(f"\nScaling: scan + plan of {count:,} tiny files: {plan['seconds']:.1f} s, "
          f"{plan['chunks']:,} shards planned, listing {plan['table_bytes'] / count:.0f} bytes "
          f"per file, peak RSS {plan['rss_mb']:.0f} MB ({plan['imported_mb']:.0f} MB after "
          "the imports)")  # fmt: skip
    scaling = _child("shardstream-1", tiny, out)
    print(f"Scaling: scan + build of {count:,} tiny files (1 worker): "
          f"{scaling['seconds']:.1f} s, {count / scaling['seconds']:,.0f} files/s, "
          f"peak RSS {scaling['rss_mb']:.0f} MB")  # fmt: skip


def _print_table(results: dict, count: int, size: int) -> None:
    tar = results.get("tar", {}).get("seconds")
    wds = results.get("webdataset", {}).get("seconds")
    mds = results.get("mosaic", {}).get("seconds")
    print(f"{count:,} images, {size / 1e6:,.0f} MB, {os.cpu_count()} CPUs\n")
    print(
        "| writer | time (s) | images/s | MB/s | vs tar | vs ShardWriter | vs MDSWriter | "
        "peak RSS (MB) |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for row, result in results.items():
        seconds = result["seconds"]
        ratio_tar = f"{tar / seconds:.2f}x" if tar else "-"
        ratio_wds = f"{wds / seconds:.2f}x" if wds else "-"
        ratio_wds += f" | {mds / seconds:.2f}x" if mds else " | -"
        rss = (
            max(result["rss_mb"], result["child_rss_mb"])
            if row != "tar"
            else result["child_rss_mb"]
        )
        print(
            f"| {row} | {seconds:.2f} | {count / seconds:,.0f} | {size / 1e6 / seconds:,.0f} | "
            f"{ratio_tar} | {ratio_wds} | {rss:.0f} |"
        )


if __name__ == "__main__":
    main()
