"""GPU training input: shardstream + GpuDecode vs NVIDIA DALI's GPU pipeline vs the CPU path.

Every row delivers what a ResNet training step takes: batches of 256 float32 224x224 images,
RandomResizedCrop (area 0.08-1, bilinear antialiased), random horizontal flip, ImageNet
normalisation, CHW, on the GPU, with their labels. Rows, each in a fresh process confined to
the same ``--cpus`` cores (the CPU budget), two epochs with the second one timed:

- ``shardstream CPU``: ``StreamingDataset(decode="pil", transform=...)`` in ``--workers``
  DataLoader workers (the fast crop path), pinned batches copied to the GPU;
- ``shardstream GPU``: ``decode="cuda"`` (workers draw the crops, the training process decodes
  with nvImageCodec's batched nvJPEG, hardware decoder where present, and crops on the GPU);
- ``shardstream GPU (torchvision)``: the same with ``GpuDecode(backend="torchvision")``;
- ``DALI GPU``: DALI's webdataset reader on the same shards, its mixed decoder with a random
  crop (``decoders.image_random_crop(device="mixed")``), GPU resize and crop-mirror-normalize,
  ``--workers`` threads, through DALI's PyTorch iterator.

Columns: images/s, the ratio to DALI GPU, CPU cores used (process tree CPU time over wall
time) and CPU ms per image. ``--check`` also compares GpuDecode's pixels with the CPU path's
for the same crops (uint8 levels before normalisation) and prints the differences.

Needs a CUDA GPU. Usage: python benchmarks/gpu.py [--num-images 20000] [--cpus 3] [--check]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _dali import build_pipeline, dali_version, write_dali_indexes
from _data import DATA_ROOT, imagenet_like
from load import transform_for

BATCH = 256
ROWS = {
    "cpu": "shardstream CPU",
    "gpu": "shardstream GPU",
    "gpu-torchvision": "shardstream GPU (torchvision)",
    "dali": "DALI GPU",
}


def shardstream_batches(row: str, paths: dict, workers: int):  # type: ignore[no-untyped-def]
    """(images on the GPU, labels) batches of one epoch, per call of the returned function."""

    from shardstream.streaming import StreamingDataLoader, StreamingDataset
    from shardstream.streaming._decoding.gpudecode import GpuDecode

    decode = {"cpu": "pil", "gpu": "cuda", "gpu-torchvision": GpuDecode(backend="torchvision")}
    ds = StreamingDataset(
        paths["shards"], batch_size=BATCH, transform=transform_for("train"), decode=decode[row]
    )
    loader = StreamingDataLoader(
        ds, num_workers=workers, persistent_workers=workers > 0, pin_memory=row == "cpu"
    )

    def epoch():  # type: ignore[no-untyped-def]
        for images, labels in loader:
            if row == "cpu":
                images = images.cuda(non_blocking=True)
                labels = labels.cuda(non_blocking=True)
            yield images, labels

    return epoch, loader


def dali_batches(paths: dict, workers: int):  # type: ignore[no-untyped-def]
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    pipe = build_pipeline(
        paths["dali_tars"], paths["dali_indexes"], BATCH, max(1, workers), gpu=True
    )
    loader = DALIGenericIterator(
        pipe, ["images", "labels"], reader_name="Reader", last_batch_policy=LastBatchPolicy.PARTIAL
    )

    def epoch():  # type: ignore[no-untyped-def]
        for batch in loader:
            yield batch[0]["images"], batch[0]["labels"]
        loader.reset()

    return epoch, loader


def process_cpu_s() -> float:
    """CPU time of this process and its live children (DataLoader workers)."""
    import psutil

    me = psutil.Process()
    total = sum(me.cpu_times()[:2])
    for child in me.children(recursive=True):
        try:
            total += sum(child.cpu_times()[:2])
        except psutil.Error:
            continue
    return total


def run_row(task: dict) -> dict:
    import torch

    cpus = task["cpus"]
    os.sched_setaffinity(0, set(range(cpus)))  # workers and threads inherit the budget
    torch.set_num_threads(1)
    torch.cuda.init()
    row, workers = task["row"], task["workers"]
    if row == "dali":
        epoch, loader = dali_batches(task["paths"], workers)
    else:
        epoch, loader = shardstream_batches(row, task["paths"], workers)
    results = []
    for _ in range(task["epochs"]):
        checksum = torch.zeros((), device="cuda")
        started, cpu_started = time.perf_counter(), process_cpu_s()
        images_seen, first = 0, None
        for images, labels in epoch():
            checksum += images[:, 0, 0, 0].float().sum() + labels.float().sum()
            images_seen += int(images.shape[0])
            if first is None:
                torch.cuda.synchronize()
                first = time.perf_counter() - started
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        results.append(
            {
                "images": images_seen,
                "seconds": seconds,
                "cpu_s": process_cpu_s() - cpu_started,
                "first_s": first,
                "shape": list(images.shape),
                "dtype": str(images.dtype),
            }
        )
    stage = getattr(getattr(loader, "dataset", None), "gpu_decode", None)
    return {"epochs": results, "stage": stage.stats() if stage is not None else None}


def spawn(task: dict, script: str = __file__) -> dict:
    """Run ``script --child TASK`` in a fresh process; its last stdout line is the result."""
    result = subprocess.run(
        [sys.executable, script, "--child", json.dumps(task)], capture_output=True, text=True
    )
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-12:])
        return {"error": tail or "failed"}
    return json.loads(result.stdout.strip().splitlines()[-1])


def prepare(num_images: int) -> dict:
    from shardstream import build_shards, read_manifest

    images = imagenet_like(num_images, 100)
    dest = DATA_ROOT / f"gpu-shards-{num_images}"
    if not (dest / "manifest.json").exists():
        shutil.rmtree(dest, ignore_errors=True)
        build_shards(images, dest, workers=min(8, os.cpu_count() or 1))
    paths = {"shards": str(dest), "count": read_manifest(str(dest)).num_samples}
    if dali_version():
        tars, indexes = write_dali_indexes(dest, dest.with_name(dest.name + "-dali-index"))
        paths.update(dali_tars=tars, dali_indexes=indexes)
    return paths


def check_pixels(paths: dict, count: int = 128) -> None:
    """GpuDecode's uint8 pixels against the CPU path's, for the same drawn crops."""
    import numpy as np
    import torch
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional

    from shardstream.streaming._decoding.encoded import EncodedBatch, crop_draw_for
    from shardstream.streaming._decoding.gpubackends import decode_with_pillow
    from shardstream.streaming._decoding.gpudecode import GpuDecode

    transform = v2.Compose([v2.RandomResizedCrop(224, antialias=True), v2.RandomHorizontalFlip()])
    draw = crop_draw_for(transform)
    assert draw is not None
    shard = sorted(Path(paths["shards"]).glob("*.tar"))[0]
    blobs = []
    with tarfile.open(shard) as tar:
        for member in tar:
            if member.name.endswith(".jpg") and len(blobs) < count:
                blobs.append(tar.extractfile(member).read())  # type: ignore[union-attr]
    torch.manual_seed(0)
    rows = [draw(blob, "jpg").params for blob in blobs]
    views = [torch.frombuffer(bytearray(blob), dtype=torch.uint8) for blob in blobs]
    batch = EncodedBatch(
        views, torch.tensor(rows, dtype=torch.int32), ["?"] * count, ["?"] * count, draw.recipe
    )
    for backend in ("nvimgcodec", "torchvision", "cpu"):
        stage = GpuDecode(device="cpu" if backend == "cpu" else "cuda", backend=backend)
        try:
            got = stage(batch).cpu().to(torch.int16)
        except Exception as error:  # report and go on: the table says what ran
            print(f"check {backend}: failed: {error!r}")
            continue
        reference = []
        decode_diffs = []
        for blob, row in zip(blobs, rows, strict=True):
            full = decode_with_pillow(blob)
            top, left, height, width, hflip = row[:5]
            crop = functional.resized_crop(
                full, top, left, height, width, [224, 224], antialias=True
            )
            reference.append(crop.flip(-1) if hflip else crop)
            if backend != "cpu":
                decoder = stage._run().backend
                whole = decoder.decode([np.frombuffer(blob, dtype=np.uint8)])[0]
                decode_diffs.append((whole.cpu().to(torch.int16) - full.to(torch.int16)).abs())
        expected = torch.stack(reference).to(torch.int16)
        diff = (got - expected).abs()
        mse = float((diff.float() ** 2).mean())
        psnr = 10 * np.log10(255**2 / mse) if mse else float("inf")
        within = [float((diff <= k).float().mean()) for k in (1, 2, 4)]
        line = (
            f"check {backend}: crop pixels vs Pillow + torchvision resized_crop: max |d| "
            f"{int(diff.max())}, mean |d| {float(diff.float().mean()):.3f}, PSNR {psnr:.1f} "
            f"dB, within 1/2/4 levels {within[0]:.4f}/{within[1]:.4f}/{within[2]:.4f}"
        )
        if decode_diffs:
            whole_diff = torch.cat([d.flatten() for d in decode_diffs]).float()
            line += (
                f"; whole-image decode vs Pillow: max |d| {int(whole_diff.max())}, "
                f"mean |d| {float(whole_diff.mean()):.3f}"
            )
        print(line, flush=True)


def print_table(results: dict, cpus: int, workers: int) -> None:
    import torch

    print(
        f"\n{torch.cuda.get_device_name(0)}, {cpus} CPU cores per row, {workers} loader "
        f"workers / DALI threads, batch {BATCH}, second epoch timed\n"
    )
    print("| loader | images/s | vs DALI GPU | CPU cores used | CPU ms/image | first batch s |")
    print("|---|---|---|---|---|---|")
    rates = {}
    for row, result in results.items():
        if "error" in result:
            continue
        last = result["epochs"][-1]
        rates[row] = last["images"] / last["seconds"]
    dali = rates.get("dali")
    for row, result in results.items():
        if "error" in result:
            first_line = result["error"].splitlines()[-1]
            print(f"| {ROWS[row]} | failed: {first_line} | | | | |")
            continue
        last = result["epochs"][-1]
        ratio = f"{rates[row] / dali:.2f}" if dali else "-"
        cores = last["cpu_s"] / last["seconds"]
        per_image_ms = 1000 * last["cpu_s"] / last["images"]
        first_s = result["epochs"][0]["first_s"]
        print(
            f"| {ROWS[row]} | {rates[row]:,.0f} | {ratio} | {cores:.2f} | {per_image_ms:.2f} "
            f"| {first_s:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-images", type=int, default=20_000)
    parser.add_argument("--cpus", type=int, default=3, help="cores each row may use")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--rows", nargs="*", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--check", action="store_true", help="compare pixels with the CPU path")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_row(json.loads(args.child))))
        return
    paths = prepare(args.num_images)
    if args.check:
        check_pixels(paths)
    results = {}
    for row in args.rows:
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
        }
        results[row] = spawn(task)
        print(ROWS[row], json.dumps(results[row])[:400], flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print_table(results, args.cpus, args.workers)


if __name__ == "__main__":
    main()
