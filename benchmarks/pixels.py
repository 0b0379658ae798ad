"""Decode once: shardstream pixel shards against JPEG shards and tensordict's memory-mapped tensors.

One ImageFolder tree of realistic JPEGs (``benchmarks/_data.py``: sides 300-640 px) is stored
in these forms:

- ``pixels``: ``build_shards(pixels="short=256")``: uint8 pixels, shorter side 256, aspect kept;
- ``jpeg``: ``build_shards(resize=256)``: JPEG (quality 90), shorter side 256 (the same pixels,
  encoded); read twice when nvImageCodec is installed: with its crop-window decode, and without
  it (the default install: Pillow / libjpeg-turbo);
- ``original``: ``build_shards()``: the source JPEGs as they are (what a build without
  ``resize`` stores), read with the best JPEG path installed;
- ``tensordict``: the pipeline of tensordict's tutorial "Batched data loading with
  tensorclasses", rebuilt here from its description with the same operations: every image
  squashed to 256x256 (aspect lost) in one ``MemoryMappedTensor`` of a ``@tensorclass``, read
  in batches by a ``DataLoader`` without workers (in order, as the tutorial does), and a collate
  function that normalises the whole batch as float, then cuts one fixed-size 224x224 random
  crop per image with ``gather`` and flips half the images with ``masked_fill`` (no
  RandomResizedCrop: no scale or aspect augmentation);
- ``dali``: NVIDIA DALI's CPU pipeline on the JPEG shards (``benchmarks/_dali.py``), when
  ``nvidia-dali-cuda130`` is installed; skipped with a note otherwise;
- ``pixels-gpu`` / ``jpeg-gpu``: the pixel and JPEG shards with ``decode=GpuDecode(device=...)``
  (``--device``, ``cuda`` by default; rows skipped without CUDA unless ``--device cpu``, which
  runs the stage's code on the CPU: a smoke run whose images/s say nothing about a GPU). The
  workers only draw the crops (and, for pixels, cut them out); the stage in the training
  process moves each pixel batch in one copy and crops, resizes, flips and normalises it in a
  few batched operations. Besides the process tree's CPU ms per image, these rows report the
  stage's host ms per image (``GpuDecode.stats()["host_s"]``: on ``--device cpu`` it includes
  the resize itself) and, for pixels, the host staging alone (filter taps and the one copy into
  the staging buffer: what a GPU run pays on its host). ``--host-split`` also times, in one
  process and in turns, one batch's host work on each path (see ``host_split``).

The shardstream rows run the train transform of ``benchmarks/load.py`` (RandomResizedCrop(224)
drawn per image, flip, float, ImageNet normalisation) with ``--workers`` DataLoader workers,
shuffled; the ``uint8 out`` rows stop after the flip (``uint8`` batches, normalised on the
device as the tensordict tutorial does, 4x fewer bytes to hand over); the tensordict row runs
with ``torch.set_num_threads(--workers)``: the same CPU budget.
Every row is one epoch, batch 64, in a fresh process; images/s counts from the first batch on
(start-up is reported apart); CPU ms per image is the whole process tree's CPU time (user +
system, workers included) from the first batch on, per image; bytes per image is what the
stored form takes on disk (tar headers and labels included for shards). Build times are per
image, on ``--build-workers``.

Usage: python benchmarks/pixels.py [--num-images 2000] [--workers 2] [--repeat 1] [--device cuda]
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

from _dali import dali_version, run_dali_epoch, write_dali_indexes
from _data import DATA_ROOT, imagenet_like
from _measure import BATCH, cpu_seconds

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]
SIDE, CROP = 256, 224
LABELS = {
    "pixels": "shardstream pixel shards (short=256)",
    "jpeg-fastjpeg": "shardstream JPEG shards, crop-window decode",
    "jpeg": "shardstream JPEG shards (Pillow/libjpeg-turbo)",
    "original": "shardstream JPEG shards, original images",
    "pixels-uint8": "shardstream pixel shards, uint8 out",
    "jpeg-uint8": "shardstream JPEG shards (Pillow), uint8 out",
    "tensordict": "tensordict memmap tensorclass (256x256)",
    "dali": "DALI CPU on the JPEG shards",
    "pixels-gpu": "shardstream pixel shards, decode=GpuDecode",
    "jpeg-gpu": "shardstream JPEG shards, decode=GpuDecode",
}
GPU_ROWS = ("pixels-gpu", "jpeg-gpu")


def train_transform(uint8: bool = False):  # type: ignore[no-untyped-def]
    """RandomResizedCrop(224), flip, then float normalised (or ``uint8``: normalise on a device)."""
    import torch
    from torchvision.transforms import v2

    steps = [
        v2.RandomResizedCrop(CROP, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.PILToTensor(),
    ]
    if not uint8:
        steps += [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, STD)]
    return v2.Compose(steps)


# -- tensordict: the tutorial's pipeline, its operations as the tutorial describes them -------


def tensordict_class():  # type: ignore[no-untyped-def]
    import torch
    from tensordict import tensorclass

    @tensorclass
    class Images:
        images: torch.Tensor
        targets: torch.Tensor

    return Images


def build_tensordict(images: Path, dest: Path, workers: int) -> None:
    """Every image resized to 256x256 (``Resize((256, 256))``) into one uint8 memory map."""
    import torch
    from tensordict import MemoryMappedTensor
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms

    raw = datasets.ImageFolder(str(images), transform=transforms.Compose(
        [transforms.Resize((SIDE, SIDE)), transforms.PILToTensor()]))  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    shape = (len(raw), 3, SIDE, SIDE)
    pixels = MemoryMappedTensor.empty(shape, dtype=torch.uint8, filename=str(dest / "images"))
    targets = MemoryMappedTensor.empty((len(raw),), dtype=torch.int64,
                                       filename=str(dest / "targets"))  # fmt: skip
    done = 0
    for image, target in DataLoader(raw, batch_size=BATCH, num_workers=workers):
        pixels[done : done + len(image)] = image
        targets[done : done + len(image)] = target
        done += len(image)
    (dest / "meta.json").write_text(json.dumps({"count": len(raw)}))


def tensordict_loader(dest: Path):  # type: ignore[no-untyped-def]
    import torch
    from tensordict import MemoryMappedTensor
    from torch import nn
    from torch.utils.data import DataLoader

    count = json.loads((dest / "meta.json").read_text())["count"]
    Images = tensordict_class()
    data = Images(
        images=MemoryMappedTensor.from_filename(
            str(dest / "images"), dtype=torch.uint8, shape=torch.Size((count, 3, SIDE, SIDE))),
        targets=MemoryMappedTensor.from_filename(
            str(dest / "targets"), dtype=torch.int64, shape=torch.Size((count,))),
        batch_size=[count],
    )  # fmt: skip

    class Normalise(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.loc = torch.tensor(MEAN).view(3, 1, 1) * 255
            self.scale = torch.tensor(STD).view(3, 1, 1) * 255

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x - self.loc) / self.scale

    class FixedCrop(nn.Module):  # one size for every image: a random place, no random scale
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            batch = x.shape[:-3]
            rows = torch.randint(x.shape[-2] - CROP, (*batch, 1)) + torch.arange(CROP)
            rows = rows.unsqueeze(1).unsqueeze(-1).expand((*batch, 3, CROP, x.shape[-1]))
            cols = torch.randint(x.shape[-1] - CROP, (*batch, 1)) + torch.arange(CROP)
            cols = cols.unsqueeze(1).unsqueeze(-2).expand((*batch, 3, CROP, CROP))
            return x.gather(-2, rows).gather(-1, cols)

    class Flip(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            chosen = torch.zeros(*x.shape[:-3], 1, 1, 1, dtype=torch.bool).bernoulli_()
            chosen = chosen.expand_as(x)
            return x.masked_fill(chosen, 0.0) + x.masked_fill(~chosen, 0.0).flip(-1)

    transform = nn.Sequential(Normalise(), FixedCrop(), Flip())

    def collate(batch):  # type: ignore[no-untyped-def]
        batch.images = transform(batch.images)  # on the CPU: no device here
        return batch

    return DataLoader(data, batch_size=BATCH, collate_fn=collate)


# -- rows ---------------------------------------------------------------------------------------


def shardstream_loader(source: str, workers: int, uint8: bool, decode: object = "pil"):  # type: ignore[no-untyped-def]
    from shardstream import StreamingDataLoader, StreamingDataset

    transform = train_transform(uint8)
    dataset = StreamingDataset(source, batch_size=BATCH, decode=decode, transform=transform)  # type: ignore[arg-type]
    return StreamingDataLoader(dataset, num_workers=workers)


class _StagingClock:
    """Host seconds spent in ``stage_pixels`` (the filter taps and the copy into the buffer)."""

    def __init__(self) -> None:
        from shardstream.streaming._decoding import gpubackends

        self.seconds, self._module = 0.0, gpubackends
        self._stage = gpubackends.stage_pixels
        gpubackends.stage_pixels = self._timed  # type: ignore[assignment]

    def _timed(self, *args):  # type: ignore[no-untyped-def]
        started = time.thread_time()  # CPU time of the stage's thread alone
        try:
            return self._stage(*args)
        finally:
            self.seconds += time.thread_time() - started


def tree_cpu_seconds() -> float:
    """CPU time of this process, of its children waited for, and of its live children."""
    import psutil

    live = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        live += times.user + times.system
    return cpu_seconds() + live


def run_row(row: str, workers: int, paths: dict, device: str = "cuda") -> dict:
    import torch

    if row == "dali":  # start-up included: DALI reports no first-batch CPU time
        cpu = cpu_seconds()
        result = run_dali_epoch(paths["dali_tars"], paths["dali_indexes"], BATCH, max(1, workers))
        seconds = result["seconds"] - result["first_s"]
        return {"samples": result["samples"], "per_s": result["samples"] / seconds,
                "first_s": result["first_s"],
                "cpu_ms": (cpu_seconds() - cpu) / result["samples"] * 1000}  # fmt: skip
    if row in ("jpeg", "jpeg-uint8"):  # the default install: no crop-window decoder
        sys.modules["nvidia.nvimgcodec"] = None  # type: ignore[assignment]
    torch.set_num_threads(workers if row == "tensordict" else 1)
    start = time.perf_counter()
    stage, staging = None, None
    if row == "tensordict":
        loader = tensordict_loader(Path(paths["tensordict"]))
    elif row in GPU_ROWS:
        from shardstream import GpuDecode

        staging = _StagingClock()
        decode = GpuDecode(device=device)
        loader = shardstream_loader(paths[row.removesuffix("-gpu")], workers, False, decode)
        stage = loader.dataset.gpu_decode  # the dataset's copy, given its transform
    else:
        source = row.removesuffix("-uint8").removesuffix("-fastjpeg")
        loader = shardstream_loader(paths[source], workers, row.endswith("-uint8"))
    first_at, first_cpu, count, host = 0.0, 0.0, 0, (0.0, 0.0)
    for batch in loader:
        images = batch.images if row == "tensordict" else batch[0]
        dtype = torch.uint8 if row.endswith("-uint8") else torch.float32
        assert images.shape[1:] == (3, CROP, CROP) and images.dtype == dtype
        if not first_at:  # start-up (imports, workers, first batch) is reported apart
            first_at, first_cpu = time.perf_counter(), tree_cpu_seconds()
            if stage is not None and staging is not None:
                host = (stage.stats()["host_s"], staging.seconds)
        else:
            count += len(images)
    if device == "cuda" and row in GPU_ROWS:
        torch.cuda.synchronize()  # the last batches' device work
    seconds = time.perf_counter() - first_at
    del loader  # workers joined: their CPU time is in RUSAGE_CHILDREN
    result = {"samples": count + BATCH, "per_s": count / seconds, "first_s": first_at - start,
              "cpu_ms": (tree_cpu_seconds() - first_cpu) / count * 1000}  # fmt: skip
    if stage is not None and staging is not None:
        result["host_ms"] = (stage.stats()["host_s"] - host[0]) / count * 1000
        result["staging_ms"] = (staging.seconds - host[1]) / count * 1000
    return result


def spawn(task: dict, repeat: int) -> dict:
    """Run a row in ``repeat`` fresh processes; keep the run with the median images/s."""
    runs = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps(task)],
                              capture_output=True, text=True)  # fmt: skip
        if done.returncode != 0:
            runs.append({"error": (done.stderr.strip().splitlines() or ["failed"])[-1]})
        else:
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    good = sorted((run for run in runs if "per_s" in run), key=lambda run: run["per_s"])
    return good[len(good) // 2] if good else runs[0]


# -- data -----------------------------------------------------------------------------------------


def prepare(args: argparse.Namespace) -> tuple[dict, dict]:
    """Build the three stored forms once (cached under bench-data/); their sizes and build times."""
    from shardstream import build_shards

    images = imagenet_like(args.num_images, args.num_classes)
    count = sum(1 for path in images.rglob("*.JPEG"))
    paths: dict = {"images": str(images)}
    facts: dict = {"source": sum(p.stat().st_size for p in images.rglob("*.JPEG")) / count}
    builds = {
        "pixels": lambda dest: build_shards(images, dest, pixels=f"short={SIDE}",
                                            workers=args.build_workers),
        "jpeg": lambda dest: build_shards(images, dest, resize=SIDE, workers=args.build_workers),
        "original": lambda dest: build_shards(images, dest, workers=args.build_workers),
        "tensordict": lambda dest: build_tensordict(images, dest, args.build_workers),
    }  # fmt: skip
    for name, build in builds.items():
        dest = DATA_ROOT / f"pixels-{name}-{args.num_images}-{args.num_classes}"
        done = dest / ".built.json"
        if not done.exists():
            shutil.rmtree(dest, ignore_errors=True)
            start = time.perf_counter()
            build(dest)
            seconds = time.perf_counter() - start
            on_disk = sum(p.stat().st_size for p in dest.rglob("*") if p.is_file())
            done.write_text(json.dumps({"build_ms": seconds / count * 1000,
                                        "bytes": on_disk / count}))  # fmt: skip
        paths[name] = str(dest)
        facts[name] = json.loads(done.read_text())
    if dali_version():
        shards = Path(paths["jpeg"])
        tars, indexes = write_dali_indexes(shards, shards.with_name(shards.name + "-dali-index"))
        paths.update(dali_tars=tars, dali_indexes=indexes)
    return paths, facts


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def host_split(paths: dict, count: int = 128, repeat: int = 5) -> None:
    """Host CPU per image of one batch of pixel crops, the paths in turns (thread CPU time):
    the CPU path's worker work (crop, resize, flip, normalise into the batch) against the GPU
    path's (draw and cut the crop, pack it) and the stage's staging (filter taps and the copy
    into the one buffer); what the device does is not in these."""
    import tarfile

    import numpy as np
    import torch

    from shardstream.streaming._decoding import gpubackends
    from shardstream.streaming._decoding.encoded import crop_draw_for
    from shardstream.streaming._decoding.fastcrop import crop_decoder_for
    from shardstream.streaming._worker.batch import stack_or_list

    torch.set_num_threads(1)
    members: list = []
    for shard in sorted(Path(paths["pixels"]).glob("*.tar")):
        with tarfile.open(shard) as tar:
            members += [tar.extractfile(m).read() for m in tar if m.name.endswith(".pixels.npy")]  # type: ignore[union-attr]
        if len(members) >= count:
            break
    members = [memoryview(bytearray(member)) for member in members[:count]]
    transform = train_transform()
    cpu, draw = crop_decoder_for(transform, "rgb8", batched=True), crop_draw_for(transform)
    times: dict[str, list[float]] = {"CPU path, worker": [], "GPU path, worker": [],
                                     "GPU path, staging": []}  # fmt: skip
    for _ in range(repeat):
        started = time.thread_time()
        stack_or_list([cpu(member, "pixels.npy") for member in members], True)  # type: ignore[misc]
        middle = time.thread_time()
        batch = stack_or_list([draw(member, "pixels.npy") for member in members], True)  # type: ignore[misc]
        staged = time.thread_time()
        rows = np.asarray(batch.params.numpy(), dtype=np.int64)
        gpubackends.stage_pixels(batch.images, rows, batch.recipe, count, torch.device("cpu"))
        done = time.thread_time()
        spans = (middle - started, staged - middle, done - staged)
        for name, seconds in zip(times, spans, strict=True):
            times[name].append(seconds / len(members) * 1000)
    print(f"host CPU ms per image, a batch of {len(members)} pixel crops, {repeat} runs in turns:")
    for name, values in times.items():
        print(
            f"    {name:<20} median {sorted(values)[len(values) // 2]:.3f}, min {min(values):.3f}"
        )


def has_nvimgcodec() -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec("nvidia.nvimgcodec") is not None
    except ImportError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-images", type=int, default=2000)
    parser.add_argument("--num-classes", type=int, default=20)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--build-workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1, help="runs per row (median kept)")
    parser.add_argument("--rows", nargs="*", help="only these rows (default: all)")
    parser.add_argument(
        "--device",
        default="cuda",
        choices=["cuda", "cpu"],
        help="where the GpuDecode rows' stage runs (cpu: a smoke run)",
    )
    parser.add_argument(
        "--host-split",
        action="store_true",
        help="also split the pixel rows' host CPU per image (CPU vs GPU path)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        task = json.loads(args.child)
        print(json.dumps(run_row(task["row"], task["workers"], task["paths"], task["device"])))
        return
    paths, facts = prepare(args)
    rows = ["pixels", "jpeg", "original", "pixels-uint8", "jpeg-uint8", "tensordict"]
    if has_nvimgcodec():
        rows.insert(1, "jpeg-fastjpeg")
    if "dali_tars" in paths:
        rows.append("dali")
    if args.device == "cpu" or cuda_available():
        rows += list(GPU_ROWS)
    if args.rows:
        rows = [row for row in rows if row in args.rows]
    print(f"{args.num_images} images, source JPEGs {facts['source'] / 1000:.1f} KB each; "
          f"batch {BATCH}, {args.workers} workers (tensordict: {args.workers} torch threads); "
          f"{os.cpu_count()} cores")  # fmt: skip
    print(f"{'row':<46} {'images/s':>9} {'CPU ms/img':>10} {'first s':>8} {'KB/img':>7} "
          f"{'build ms/img':>12}")  # fmt: skip
    results = {}
    for row in rows:
        task = {"row": row, "workers": args.workers, "paths": paths, "device": args.device}
        result = spawn(task, args.repeat)
        results[row] = result
        stored = facts.get(row.split("-")[0], {})
        size = f"{stored['bytes'] / 1000:7.1f}" if stored else f"{'-':>7}"
        build = f"{stored['build_ms']:12.2f}" if stored else f"{'-':>12}"
        if "per_s" not in result:
            print(f"{LABELS[row]:<46} failed: {result.get('error')}")
            continue
        print(f"{LABELS[row]:<46} {result['per_s']:9.0f} {result['cpu_ms']:10.2f} "
              f"{result['first_s']:8.2f} {size} {build}")  # fmt: skip
        if "host_ms" in result:
            staging = f", of it staging {result['staging_ms']:.3f}" if row == "pixels-gpu" else ""
            print(f"    stage on {args.device}: host {result['host_ms']:.3f} ms/img{staging}")
    if args.host_split:
        host_split(paths)
    if "dali" not in rows:
        print("DALI: not installed (pip install nvidia-dali-cuda130); row skipped")
    base = results.get("pixels", {}).get("per_s")
    if base:
        ratios = [f"{name} {base / result['per_s']:.2f}x" for name, result in results.items()
                  if name != "pixels" and "per_s" in result]  # fmt: skip
        print("pixel shards' images/s against each row: " + ", ".join(ratios))
        cpu = results["pixels"]["cpu_ms"]  # what a busy shared machine's wall clock hides
        ratios = [f"{name} {result['cpu_ms'] / cpu:.2f}x" for name, result in results.items()
                  if name != "pixels" and "cpu_ms" in result]  # fmt: skip
        print("each row's CPU ms per image against pixel shards': " + ", ".join(ratios))


if __name__ == "__main__":
    main()
