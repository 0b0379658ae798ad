"""Stream a shardstream dataset into a DataLoader: the ImageFolder + DataLoader replacement.

Run: python examples/02_stream_locally.py   (writes under $SHARDSTREAM_EXAMPLE_DIR or a temp dir)
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


def make_samples(count: int = 96, num_classes: int = 4) -> list[dict]:
    rng = np.random.default_rng(0)
    samples = []
    for index in range(count):
        buffer = io.BytesIO()
        pixels = rng.integers(0, 256, size=(40, 56, 3), dtype=np.uint8)
        Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=85)
        samples.append(
            {
                "__key__": f"img{index:04d}",
                "jpg": buffer.getvalue(),
                "cls": index * num_classes // count,
            }
        )
    return samples


def main() -> None:
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    build_shards(make_samples(), work / "train", max_samples_per_shard=20)

    train_transform = v2.Compose(
        [
            v2.RandomResizedCrop(32, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
        ]
    )
    ds = StreamingDataset(
        work / "train",
        shuffle=True,
        seed=0,
        decode="rgb8",
        transform=train_transform,
        batch_size=16,
    )
    loader = StreamingDataLoader(ds, num_workers=2)
    for epoch in range(2):
        ds.set_epoch(epoch)
        labels_seen: list[int] = []
        shapes = set()
        for images, labels in loader:
            shapes.add((tuple(images.shape), str(images.dtype)))
            labels_seen += labels.tolist()
        print(
            f"epoch {epoch}: {len(ds)} batches of {sorted(shapes)}, "
            f"{len(labels_seen)} samples, first labels {labels_seen[:8]}"
        )


if __name__ == "__main__":
    main()
