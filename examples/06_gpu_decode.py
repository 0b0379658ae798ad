"""Decode and augment on the GPU: `decode="cuda"`, and the same script on a machine without one.

Workers draw each RandomResizedCrop and flip and hand over the encoded bytes; the loader decodes,
crops and normalises on the GPU in the training process. Without CUDA the same code decodes on
the CPU in the workers (same transform, same draws). Either way this checks that every image of
the epoch arrives once, as a normalised float32 batch on the chosen device.

Run: python examples/06_gpu_decode.py   (writes under $SHARDSTREAM_EXAMPLE_DIR or a temp dir)
"""

from __future__ import annotations

import io
import os
import pathlib
import tempfile

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2

from shardstream import StreamingDataLoader, StreamingDataset, build_shards

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def make_samples(count: int = 120, num_classes: int = 6) -> list[dict]:
    rng = np.random.default_rng(0)
    samples = []
    for index in range(count):
        buffer = io.BytesIO()
        height, width = int(rng.integers(60, 120)), int(rng.integers(60, 160))
        pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=85)
        samples.append({"__key__": f"img{index:04d}", "jpg": buffer.getvalue(), "cls": index % 6})
    return samples


def main() -> None:
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    build_shards(make_samples(), work / "train", max_samples_per_shard=32)
    train_transform = v2.Compose(
        [
            v2.RandomResizedCrop(64, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )
    ds = StreamingDataset(work / "train", batch_size=24, transform=train_transform, decode="cuda")
    loader = StreamingDataLoader(ds, num_workers=2)
    where = "the GPU" if ds.gpu_decode is not None else "the CPU (no CUDA here)"
    labels_seen = []
    for images, labels in loader:
        assert images.shape[1:] == (3, 64, 64) and images.dtype == torch.float32
        labels_seen += labels.tolist()
    assert sorted(labels_seen) == sorted(index % 6 for index in range(120)), "each image once"
    print(f"decoded {len(labels_seen)} images on {where}: {len(loader)} batches")
    if ds.gpu_decode is not None:
        print("stage:", ds.gpu_decode.stats())


if __name__ == "__main__":
    main()
