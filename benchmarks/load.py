"""Loading benchmark: ImageFolder vs webdataset vs DALI CPU vs shardstream vs the decode limit.

One ImageFolder tree of realistic JPEGs (default 20,000 images, 100 classes) is packed once with
shardstream (shuffled, and class-ordered for the shuffle-quality row). Every row runs one epoch in
a fresh child process, batch 64, with 0 and 2 workers, in two modes: "raw" (bytes, no decode) and
"train" (decode + RandomResizedCrop(224) + flip + float tensor normalised with ImageNet's mean and
std); raw mode also runs shardstream with ``memory_map=False`` and with the whole-shard
order (what the default order's mixing costs). "limit" decodes and transforms
bytes already in memory in a tight loop (one core; scaled by the worker count for ratios). Peak
memory is the sum of RSS over the process and its DataLoader workers, sampled; it counts shared
memory in every process that maps it, and the page-cache pages of memory-mapped shards. CPU
ms/sample is the CPU time (user + system) of the row's whole process tree, DataLoader workers and
DALI threads included, per sample.

Thread rows: "shardstream, threads" is ``StreamingDataLoader(num_threads=N)`` with N the
column's worker count (the same core budget), and "SPDL" is Meta's thread-pool loader with its
own decoder on the same shards (``benchmarks/_spdl.py``; ``pip install spdl`` and FFmpeg's
shared libraries, skipped with a note otherwise), with as many threads (at least 1). Each
row's process runs torch on one thread, as a DataLoader worker does; ``--torch-threads 0``
keeps torch's default (one per core) there, as a training process does, which is what the
thread rows meet in training.

Train mode also runs NVIDIA DALI's CPU pipeline on the same shards (``benchmarks/_dali.py``; it
needs ``pip install nvidia-dali-cuda130`` and is skipped with a note otherwise), with as many
DALI threads as DataLoader workers (at least 1). When ``nvidia-nvimgcodec-cu13`` is installed,
shardstream runs twice: "shardstream" with it hidden (the default install: Pillow/torchvision
decode) and "shardstream[fastjpeg]" with its crop-window JPEG decode.
Also: start-up at many tiny samples (time to first batch, memory) against ImageFolder's
construction, a cold-cache row (page cache dropped; needs root) and class mix per batch.

Usage: python benchmarks/load.py [--num-images 20000] [--tiny 1000000] [--workers 0 2]
       [--torch-threads 0]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import importlib.util

from _dali import dali_version, run_dali_epoch, write_dali_indexes
from _data import DATA_ROOT, imagenet_like, tiny_tree
from _extra import class_mix, report_extra, startup
from _measure import BATCH, PeakRss, cpu_seconds
from _spdl import run_spdl_epoch, spdl_version

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
#: The whole-shard order: whole shards, 64 lanes of 64 samples (less mixed, fewer reads).
WHOLE_SHARDS = {"chunk_size": 0, "num_open": 64, "piece_size": 64}
LABELS = {
    "shardstream-fastjpeg": "shardstream[fastjpeg]",
    "shardstream-read": "shardstream, memory_map=False",
    "shardstream-shards": "shardstream, whole-shard order",
    "shardstream-stats": "shardstream, stats=True",
    "shardstream-threads": "shardstream, threads",
    "dali": "DALI CPU",
    "spdl": "SPDL",
}


def transform_for(mode: str):  # type: ignore[no-untyped-def]
    import torch
    from torchvision.transforms import v2

    if mode == "raw":
        return None
    return v2.Compose(
        [
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


def make_loader(row: str, mode: str, workers: int, paths: dict, epochs: int = 1):  # type: ignore[no-untyped-def]
    import torch
    from torch.utils.data import DataLoader

    transform = transform_for(mode)
    if row == "imagefolder":
        from torchvision.datasets import ImageFolder

        loader = (lambda p: Path(p).read_bytes()) if mode == "raw" else None
        kwargs = {"loader": loader} if loader else {}
        ds = ImageFolder(paths["images"], transform=transform, **kwargs)
        collate = (lambda b: b) if mode == "raw" else None
        return DataLoader(
            ds, batch_size=BATCH, shuffle=True, num_workers=workers, collate_fn=collate
        )
    if row == "webdataset":
        import webdataset as wds

        urls = sorted(str(p) for p in Path(paths["shards"]).glob("shard-*.tar"))
        ds = wds.WebDataset(urls, shardshuffle=len(urls), empty_check=False).shuffle(1000)
        if mode == "raw":
            ds = ds.to_tuple("jpg", "cls")
        else:
            ds = ds.decode("pil").to_tuple("jpg", "cls").map_tuple(transform, int)
        collate = (lambda b: b) if mode == "raw" else None
        persist = _persist(workers, epochs)
        return DataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=collate, **persist)
    from shardstream.streaming import StreamingDataset, StreamOptions

    ds = StreamingDataset(
        paths["shards"],
        decode="raw" if mode == "raw" else "pil",
        transform=transform,
        batch_size=BATCH,
        options=StreamOptions(
            memory_map=row != "shardstream-read",
            **(WHOLE_SHARDS if row == "shardstream-shards" else {}),
            **({"stats": True} if row == "shardstream-stats" else {}),  # older releases: no stats
        ),
    )
    del torch
    if row == "shardstream-threads":
        from shardstream.streaming import StreamingDataLoader

        return StreamingDataLoader(ds, num_threads=max(1, workers))
    return DataLoader(ds, batch_size=None, num_workers=workers, **_persist(workers, epochs))


def _persist(workers: int, epochs: int) -> dict:
    """Workers that stay for the next epoch when several are measured (as a trainer keeps them)."""
    return {"persistent_workers": True} if workers and epochs > 1 else {}


def run_epoch(row: str, mode: str, workers: int, paths: dict, epochs: int = 1) -> dict:
    """One row: samples/s, time to first batch, peak memory, CPU ms/sample.

    With ``epochs > 1`` samples/s is of the epochs after the first (the steady rate, start-up
    left out; workers persist); CPU ms/sample is of all epochs.
    """
    if row == "limit":
        return run_limit(mode, paths)
    if row == "dali":
        return run_dali(workers, paths)
    if row == "spdl":
        return run_spdl(mode, workers, paths, epochs)
    if row in ("shardstream", "shardstream-stats", "shardstream-threads"):  # no crop decode
        sys.modules["nvidia.nvimgcodec"] = None  # type: ignore[assignment]
    memory = PeakRss()
    cpu = cpu_seconds()
    start = time.perf_counter()
    loader = make_loader(row, mode, workers, paths, epochs)
    if row == "shardstream-stats":  # the training loop's side of the statistics too
        from shardstream.streaming._diagnostics.stats import LoaderStats

        loader = LoaderStats(loader.dataset).watch(loader)
    first, count = None, 0
    steady, steady_count = start, 0
    for epoch in range(epochs):
        if epoch == 1:
            steady, steady_count = time.perf_counter(), count
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            count += (
                len(batch[1])
                if isinstance(batch, (tuple, list))
                and len(batch) == 2
                and not isinstance(batch[0], tuple)
                else len(batch)
            )
    seconds = time.perf_counter() - steady
    del loader  # its workers have exited and been joined: their CPU time is in RUSAGE_CHILDREN
    return {
        "samples": count,
        "per_s": (count - steady_count) / seconds,
        "first_s": first,
        "mb": memory.stop(),
        "cpu_ms": (cpu_seconds() - cpu) / max(count, 1) * 1000,
    }


def run_dali(workers: int, paths: dict) -> dict:
    """One epoch of DALI's CPU pipeline with ``max(1, workers)`` threads."""
    memory = PeakRss()
    cpu = cpu_seconds()
    r = run_dali_epoch(paths["dali_tars"], paths["dali_indexes"], BATCH, max(1, workers))
    return {
        "samples": r["samples"],
        "per_s": r["samples"] / r["seconds"],
        "first_s": r["first_s"],
        "mb": memory.stop(),
        "cpu_ms": (cpu_seconds() - cpu) / max(r["samples"], 1) * 1000,
    }


def run_spdl(mode: str, workers: int, paths: dict, epochs: int = 1) -> dict:
    """SPDL's pipeline with ``max(1, workers)`` threads (one pipeline per epoch, as SPDL's
    examples build it); ``epochs`` as in :func:`run_epoch`."""
    memory = PeakRss()
    cpu = cpu_seconds()
    runs = [run_spdl_epoch(paths["shards"], mode, BATCH, max(1, workers)) for _ in range(epochs)]
    r = runs[0]
    steady = runs[1:] or runs
    return {
        "samples": sum(run["samples"] for run in runs),
        "per_s": sum(run["samples"] for run in steady) / sum(run["seconds"] for run in steady),
        "first_s": r["first_s"],
        "mb": memory.stop(),
        "cpu_ms": (cpu_seconds() - cpu) / max(sum(run["samples"] for run in runs), 1) * 1000,
    }


def run_limit(mode: str, paths: dict) -> dict:
    import io

    from PIL import Image

    files = sorted(Path(paths["images"]).rglob("*.JPEG"))[:2000]
    blobs = [f.read_bytes() for f in files]
    transform = transform_for(mode)
    memory = PeakRss()
    cpu = cpu_seconds()
    start = time.perf_counter()
    for data in blobs:
        if mode == "raw":
            continue
        transform(Image.open(io.BytesIO(data)).convert("RGB"))
    seconds = max(time.perf_counter() - start, 1e-9)
    return {
        "samples": len(blobs),
        "per_s": len(blobs) / seconds,
        "first_s": 0.0,
        "mb": memory.stop(),
        "cpu_ms": (cpu_seconds() - cpu) / len(blobs) * 1000,
    }


def warm_page_cache(row: str, paths: dict) -> None:
    """Read the row's files once, so that every warm row starts from the same (cached) state."""
    root = Path(paths["images"] if row in ("imagefolder", "limit") else paths["shards"])
    if row == "dali":
        root = Path(paths["dali_indexes"][0]).parent  # the indexes; the shards are read below
        warm_page_cache("shardstream", paths)
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb", buffering=0) as stream:
                while stream.read(8 << 20):
                    pass


def child(task: dict) -> dict:
    import torch
    import torch.utils.data  # imports are not part of any row's time
    import torchvision.datasets  # noqa: F401
    import webdataset  # noqa: F401

    # shardstream.streaming loads its modules on first use: name what the rows use.
    from shardstream.streaming import StreamingDataset, StreamOptions  # noqa: F401

    if task.get("row") == "dali":
        import nvidia.dali  # noqa: F401
    if task.get("row") == "spdl":
        import spdl.io
        import spdl.pipeline  # noqa: F401

    # One torch thread, as in DataLoader workers: in the main process (0 workers, "limit") torch's
    # default of one thread per core only adds spinning on these small tensors. --torch-threads 0
    # keeps torch's default instead, as a training process does (what thread rows then meet).
    if task.get("torch_threads", 1):
        torch.set_num_threads(task.get("torch_threads", 1))

    kind = task["kind"]
    if kind == "epoch":
        warm_page_cache(task["row"], task["paths"])
        epochs = task.get("epochs", 1)
        return run_epoch(task["row"], task["mode"], task["workers"], task["paths"], epochs)
    if kind == "mix":
        return {"mix": class_mix(task["row"], task["paths"])}
    if kind == "cold":
        Path("/proc/sys/vm/drop_caches").write_text("1\n")
        return run_epoch(task["row"], task["mode"], task["workers"], task["paths"])
    return startup(task["row"], task["paths"])


def spawn(task: dict, repeat: int = 1) -> dict:
    """Run ``task`` in ``repeat`` fresh processes; keep the run with the median samples/s.

    One epoch lasts seconds on this data, and run-to-run noise on a small shared machine is
    +-20%, so single runs are not comparable.
    """
    runs = [_spawn_once(task) for _ in range(repeat)]
    good = sorted((r for r in runs if "per_s" in r), key=lambda r: r["per_s"])
    return good[len(good) // 2] if good else runs[0]


def _spawn_once(task: dict) -> dict:
    result = subprocess.run(
        [sys.executable, __file__, "--child", json.dumps(task)], capture_output=True, text=True
    )
    if result.returncode != 0:
        return {"error": result.stderr.strip().splitlines()[-1] if result.stderr else "failed"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def is_current(dest: Path) -> bool:
    """True when ``dest`` holds shards in the current format (every shard has its .idx index)."""
    from shardstream import read_manifest

    if not (dest / "manifest.json").exists():
        return False
    try:
        return all(shard.index for shard in read_manifest(str(dest)).shards)
    except Exception:
        return False


def prepare(args: argparse.Namespace) -> dict:
    from shardstream import build_shards

    images = imagenet_like(args.num_images, args.num_classes)
    paths = {"images": str(images), "num_classes": args.num_classes}
    for name, shuffle in (("shards", True), ("ordered", False)):
        dest = DATA_ROOT / f"load-{name}-{args.num_images}-{args.num_classes}"
        if not is_current(dest):  # stale caches (no byte-offset index) are rebuilt
            shutil.rmtree(dest, ignore_errors=True)
            build_shards(images, dest, shuffle=shuffle, workers=2)
        paths[name] = str(dest)
    if args.tiny:
        tiny = tiny_tree(args.tiny)
        dest = DATA_ROOT / f"load-tiny-{args.tiny}"
        if not is_current(dest):
            shutil.rmtree(dest, ignore_errors=True)
            build_shards(tiny, dest, workers=2)
        paths.update(tiny=str(tiny), tiny_shards=str(dest))
    if dali_version() and "train" in args.modes:
        shards = Path(paths["shards"])
        tars, indexes = write_dali_indexes(shards, shards.with_name(shards.name + "-dali-index"))
        paths.update(dali_tars=tars, dali_indexes=indexes)
    paths["spdl"] = spdl_version()
    return paths


def versions() -> str:
    """The versions of every library a row uses, for the table's caption."""
    from importlib import metadata

    names = ["shardstream", "torch", "torchvision", "webdataset", "Pillow", "nvidia-dali-cuda130"]
    names.append("spdl")
    names.append("nvidia-nvimgcodec-cu13")
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def has_nvimgcodec() -> bool:
    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ImportError:  # no "nvidia" package at all
        return False


def rows_for(mode: str, paths: dict, workers: int) -> list[str]:
    """The loaders measured in ``mode``: DALI in train mode and SPDL when installed,
    shardstream with and without nvImageCodec when it is installed, with threads at a budget of
    one core or more, and in raw mode also without memory maps."""
    rows = ["imagefolder", "webdataset"]
    if mode == "train" and "dali_tars" in paths:
        rows.append("dali")
    if paths.get("spdl"):
        rows.append("spdl")
    rows.append("shardstream")
    if workers > 0:
        rows.append("shardstream-threads")
    if mode == "raw":
        rows += ["shardstream-read", "shardstream-shards", "shardstream-stats"]
    if mode == "train" and has_nvimgcodec():
        rows.append("shardstream-fastjpeg")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-images", type=int, default=20_000)
    parser.add_argument("--num-classes", type=int, default=100)
    parser.add_argument("--tiny", type=int, default=1_000_000, help="0 skips the start-up row")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--modes", nargs="+", default=["raw", "train"])
    parser.add_argument("--repeat", type=int, default=3, help="runs per row (median kept)")
    parser.add_argument(
        "--epochs", type=int, default=1, help="epochs per run (>1: samples/s after the first)"
    )
    parser.add_argument("--no-extra", action="store_true", help="skip the table of extra rows")
    parser.add_argument("--loaders", nargs="+", help="only these rows (e.g. shardstream)")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads of the measuring process (0: torch's default, one per core)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    paths = prepare(args)
    print(
        f"\n{args.num_images} images, {args.num_classes} classes, batch {BATCH}, "
        f"{os.cpu_count()} CPUs, median of {args.repeat} runs per row"
        f"{f', samples/s of epochs 2-{args.epochs}' if args.epochs > 1 else ''}"
        f"{', torch threads: default' if not args.torch_threads else ''}\n{versions()}\n"
    )
    if "train" in args.modes and "dali_tars" not in paths:
        print("DALI CPU: skipped, nvidia.dali does not import (pip install nvidia-dali-cuda130)\n")
    if not paths.get("spdl"):
        print("SPDL: skipped, spdl.io does not load (pip install spdl, and FFmpeg's libraries)\n")
    print(
        "| mode | workers | loader | samples/s | vs limit | vs ImageFolder | vs DALI CPU "
        "| CPU ms/sample | first batch s | peak MB |\n|---|---|---|---|---|---|---|---|---|---|"
    )
    for mode in args.modes:
        limit = spawn({"kind": "epoch", "row": "limit", "mode": mode, "workers": 0, "paths": paths})
        for workers in args.workers:
            results = {}
            for row in rows_for(mode, paths, workers):
                if args.loaders and row not in args.loaders:
                    continue
                task = {"kind": "epoch", "row": row, "mode": mode, "workers": workers}
                task["epochs"] = args.epochs
                task["torch_threads"] = args.torch_threads
                results[row] = spawn({**task, "paths": paths}, repeat=args.repeat)
            print_rows(mode, workers, results, limit)
        if mode == "train":
            print(
                f"| {mode} | - | limit (1 core) | {limit.get('per_s', 0):.0f} | 1.00 | - | - | "
                f"{limit.get('cpu_ms', 0):.2f} | - | {limit.get('mb', 0):.0f} |"
            )
    if not args.no_extra:
        report_extra(args, paths, spawn)


def print_rows(mode: str, workers: int, results: dict, limit: dict) -> None:
    """One table row per loader, with ratios to the limit, ImageFolder and DALI CPU."""
    base = results.get("imagefolder", {}).get("per_s")
    dali = results.get("dali", {}).get("per_s")
    cap = limit.get("per_s", 0) * max(1, workers) if mode == "train" else 0
    for row, r in results.items():
        name = LABELS.get(row, row)
        if "error" in r:
            print(f"| {mode} | {workers} | {name} | error: {r['error']} |||||||")
            continue
        ratios = [r["per_s"] / x if x else None for x in (cap, base, dali)]
        vs = " | ".join("-" if x is None else f"{x:.2f}" for x in ratios)
        print(
            f"| {mode} | {workers} | {name} | {r['per_s']:.0f} | {vs} | {r['cpu_ms']:.2f} | "
            f"{r['first_s']:.2f} | {r['mb']:.0f} |"
        )


if __name__ == "__main__":
    main()
