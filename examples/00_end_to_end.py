"""The main job, end to end: make an image folder, pack it into shards, stream it for training.

Run: python examples/00_end_to_end.py [WORK_DIR]
(uses WORK_DIR, else $SHARDSTREAM_EXAMPLE_DIR, else a temporary folder)

1. writes an ImageFolder tree of 400 real JPEGs in 8 classes (a stand-in for your data),
2. builds WebDataset shards with 2 worker processes, manifest written last, then verifies them,
3. streams one shuffled training epoch through 2 DataLoader workers (decode, random crop, flip,
   batching inside the workers) and checks that every sample came exactly once.
"""

from __future__ import annotations

import collections
import io
import os
import pathlib
import sys
import tempfile
import time

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2

from shardstream import StreamingDataLoader, StreamingDataset, build_shards, verify_dataset


def make_image_folder(root: pathlib.Path, num_classes: int = 8, per_class: int = 50) -> None:
    """Photo-like JPEGs (smooth colour fields plus texture), 160-320 px a side."""
    rng = np.random.default_rng(0)
    for label in range(num_classes):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            width, height = (int(v) for v in rng.integers(160, 321, size=2))
            coarse = rng.integers(0, 256, size=(4, 5, 3), dtype=np.uint8)
            smooth = np.asarray(Image.fromarray(coarse).resize((width, height), Image.BICUBIC))
            pixels = np.clip(smooth + rng.normal(0, 12, smooth.shape), 0, 255).astype(np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels).save(buffer, format="JPEG", quality=90)
            (folder / f"img_{index:04d}.jpg").write_bytes(buffer.getvalue())


def main() -> None:
    default = os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp()
    work = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else default)
    images, shards = work / "images", work / "shards"
    make_image_folder(images)

    started = time.perf_counter()
    manifest = build_shards(images, shards, max_samples_per_shard=64, workers=2, overwrite=True)
    verify_dataset(str(shards))
    print(
        f"built {manifest.num_samples} samples into {len(manifest.shards)} shards "
        f"({manifest.num_bytes / 1e6:.1f} MB) in {time.perf_counter() - started:.2f} s; verified"
    )

    train_transform = v2.Compose(
        [
            v2.RandomResizedCrop(128, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
        ]
    )
    ds = StreamingDataset(
        shards,
        shuffle=True,
        seed=0,
        decode="rgb8",
        transform=train_transform,
        batch_size=32,
        policy="drop",
    )
    loader = StreamingDataLoader(ds, num_workers=2)
    ds.set_epoch(0)
    started = time.perf_counter()
    counts: collections.Counter[int] = collections.Counter()
    shapes: collections.Counter[tuple[tuple[int, ...], torch.dtype]] = collections.Counter()
    for batch_images, labels in loader:
        shapes[(tuple(batch_images.shape), batch_images.dtype)] += 1
        counts.update(labels.tolist())
    seconds = time.perf_counter() - started
    seen = sum(counts.values())
    print(
        f"streamed {shapes.total()} batches ({seen} samples, {seen / seconds:.0f} samples/s): "
        + ", ".join(f"{n} x {shape} {dtype}" for (shape, dtype), n in shapes.items())
    )
    print(f"samples per class: {dict(sorted(counts.items()))}")
    if seen != manifest.num_samples or len(counts) != len(manifest.class_names or ()):
        raise SystemExit(f"expected every one of {manifest.num_samples} samples exactly once")
    print("every sample streamed exactly once: OK")


if __name__ == "__main__":
    main()
