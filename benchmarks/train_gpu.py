"""Training speed from each loader: how close a real model trains to its own speed.

A loader is judged inside a training job. Every row trains the same torchvision model (SGD,
bf16 autocast and channels_last on CUDA) on batches of 256 224x224 images (RandomResizedCrop,
flip, ImageNet normalisation) for ``--epochs`` epochs, the last one timed, each row in a fresh
process confined to ``--cpus`` cores:

- ``model alone``: one batch already on the device, trained on again and again (the model's
  own speed: the ceiling every loader is measured against);
- ``shardstream GPU``: ``decode="cuda"`` (workers draw the crops; ``GpuDecode`` decodes, crops
  and normalises beside the training step, on its own thread and CUDA stream);
- ``shardstream GPU, pixel shards``: the same images stored as pixels (``build_shards(...,
  pixels="short=256")``) with ``decode="cuda"``: workers cut each drawn crop out, the stage
  moves a batch in one copy and crops, resizes, flips and normalises it on the device (with
  ``--device cpu``, ``GpuDecode(device="cpu")``: the same code on the CPU);
- ``shardstream CPU``: the CPU path in ``--workers`` DataLoader worker processes, pinned;
- ``shardstream CPU, threads``: the same in ``num_threads=--workers`` threads;
- ``DALI GPU``: DALI's webdataset reader, mixed decoder with a random crop, GPU resize and
  crop-mirror-normalize, ``--workers`` threads (needs ``nvidia-dali-cuda130``).

Columns: images/s, the fraction of the model alone, the ratio to DALI GPU, CPU cores used and
CPU ms per image. ``--device cpu`` runs the CPU rows on the CPU with a small image count (a
smoke run of the script where there is no GPU; its figures say nothing about GPU training).

Usage: python benchmarks/train_gpu.py [--model resnet50] [--cpus 3] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gpu import BATCH, dali_batches, prepare, process_cpu_s, spawn
from load import transform_for

ROWS = {
    "model": "model alone (one resident batch)",
    "gpu": "shardstream GPU",
    "gpu-pixels": "shardstream GPU, pixel shards",
    "cpu": "shardstream CPU",
    "cpu-threads": "shardstream CPU, threads",
    "dali": "DALI GPU",
}
CUDA_ONLY = {"gpu", "dali"}


def shardstream_epoch(row: str, paths: dict, workers: int, device: str, batch: int):  # type: ignore[no-untyped-def]
    from shardstream import GpuDecode, StreamingDataLoader, StreamingDataset

    decode: object = "pil"
    if row.startswith("gpu"):
        decode = GpuDecode(device=device)
    ds = StreamingDataset(
        paths["pixel_shards" if row == "gpu-pixels" else "shards"],
        batch_size=batch,
        transform=transform_for("train"),
        decode=decode,  # type: ignore[arg-type]
    )
    if row == "cpu-threads":
        loader = StreamingDataLoader(ds, num_threads=workers, pin_memory=device == "cuda")
    else:
        loader = StreamingDataLoader(
            ds, num_workers=workers, persistent_workers=workers > 0, pin_memory=device == "cuda"
        )

    def epoch():  # type: ignore[no-untyped-def]
        for images, labels in loader:
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)

    return epoch


def resident_epoch(paths: dict, device: str, batch: int):  # type: ignore[no-untyped-def]
    import torch

    images = torch.randn(batch, 3, 224, 224, device=device)
    labels = torch.randint(0, 100, (batch,), device=device)
    steps = max(1, paths["count"] // batch)

    def epoch():  # type: ignore[no-untyped-def]
        for _ in range(steps):
            yield images, labels

    return epoch


def run_row(task: dict) -> dict:
    import torch
    import torchvision

    os.sched_setaffinity(0, set(range(min(task["cpus"], os.cpu_count() or 1))))
    torch.set_num_threads(1 if task["device"] == "cuda" else max(1, task["cpus"] // 2))
    device, row, batch = task["device"], task["row"], task["batch"]
    model = getattr(torchvision.models, task["model"])(num_classes=100).to(device)
    cuda = device == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    if row == "model":
        epoch = resident_epoch(task["paths"], device, batch)
    elif row == "dali":
        epoch = dali_batches(task["paths"], task["workers"])[0]
    else:
        epoch = shardstream_epoch(row, task["paths"], task["workers"], device, batch)
    results = []
    for _ in range(task["epochs"]):
        started, cpu_started, seen = time.perf_counter(), process_cpu_s(), 0
        for images, labels in epoch():
            if cuda:
                images = images.contiguous(memory_format=torch.channels_last)
            with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
                loss = torch.nn.functional.cross_entropy(model(images), labels.long() % 100)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            seen += int(images.shape[0])
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        results.append({"images": seen, "seconds": seconds, "cpu_s": process_cpu_s() - cpu_started})
    return {"epochs": results}


def prepare_pixels(num_images: int) -> str:
    """The same images as pixel shards (shorter side 256), built once."""
    import shutil

    from _data import DATA_ROOT, imagenet_like

    from shardstream import build_shards

    dest = DATA_ROOT / f"gpu-pixels-{num_images}"
    if not (dest / "manifest.json").exists():
        shutil.rmtree(dest, ignore_errors=True)
        images = imagenet_like(num_images, 100)
        build_shards(images, dest, pixels="short=256", workers=min(8, os.cpu_count() or 1))
    return str(dest)


def print_table(results: dict, args: argparse.Namespace) -> None:
    print(
        f"\n{args.model}, {args.device}, {args.cpus} CPU cores per row, {args.workers} workers /"
        f" threads, batch {args.batch}, epoch {args.epochs} timed\n"
    )
    print(
        "| loader | images/s | of the model alone | vs DALI GPU | CPU cores used | CPU ms/image |"
    )
    print("|---|---|---|---|---|---|")
    rates = {
        row: r["epochs"][-1]["images"] / r["epochs"][-1]["seconds"]
        for row, r in results.items()
        if "error" not in r
    }
    for row, result in results.items():
        if "error" in result:
            print(f"| {ROWS[row]} | failed: {result['error'].splitlines()[-1]} | | | | |")
            continue
        last = result["epochs"][-1]
        alone = f"{rates[row] / rates['model']:.2f}" if "model" in rates else "-"
        dali = f"{rates[row] / rates['dali']:.2f}" if "dali" in rates else "-"
        cores = last["cpu_s"] / last["seconds"]
        print(
            f"| {ROWS[row]} | {rates[row]:,.0f} | {alone} | {dali} | {cores:.2f} "
            f"| {1000 * last['cpu_s'] / last['images']:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50", help="a torchvision.models name")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--num-images", type=int, default=None, help="20,000 on cuda, 256 on cpu")
    parser.add_argument("--batch", type=int, default=None, help="256 on cuda, 32 on cpu")
    parser.add_argument("--cpus", type=int, default=3, help="cores each row may use")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_row(json.loads(args.child))))
        return
    cpu = args.device == "cpu"
    args.batch = args.batch or (32 if cpu else BATCH)
    num_images = args.num_images or (256 if cpu else 20_000)
    paths = prepare(num_images)
    if "gpu-pixels" in args.rows:
        paths["pixel_shards"] = prepare_pixels(num_images)
    results = {}
    for row in args.rows:
        if cpu and row in CUDA_ONLY:
            continue
        if row == "dali" and "dali_tars" not in paths:
            results[row] = {
                "error": "nvidia.dali does not import (pip install nvidia-dali-cuda130)"
            }
            continue
        task = {
            "row": row,
            "paths": paths,
            "workers": args.workers,
            "cpus": args.cpus,
            "epochs": args.epochs,
            "device": args.device,
            "model": args.model,
            "batch": args.batch,
        }
        results[row] = spawn(task, __file__)
        print(ROWS[row], json.dumps(results[row])[:300], flush=True)
    print_table(results, args)


if __name__ == "__main__":
    main()
