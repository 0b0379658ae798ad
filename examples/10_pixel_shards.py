"""Decode once: store images as uint8 pixels, then train-crop them without a JPEG decode.

``build_shards(pixels="short=64")`` decodes every image at build time and stores it, shorter
side 64 with the aspect kept, as a ``KEY.pixels.npy`` member (``numpy.load`` reads it). The
reader takes it as the sample's image: the transform's RandomResizedCrop is drawn per image as
for JPEGs and cut straight from the shard's memory map.

Run: python examples/10_pixel_shards.py   (writes under $SHARDSTREAM_EXAMPLE_DIR or a temp dir)
"""

from __future__ import annotations

import io
import os
import pathlib
import tarfile
import tempfile

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import v2

from shardstream import StreamingDataLoader, StreamingDataset, build_shards


def make_image_folder(root: pathlib.Path, num_classes: int = 4, per_class: int = 24) -> None:
    rng = np.random.default_rng(0)
    for label in range(num_classes):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            height, width = (int(side) for side in rng.integers(80, 160, 2))
            pixels = rng.integers(0, 256, size=(height, width, 3), dtype=np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=85)
            (folder / f"img_{index:03d}.jpg").write_bytes(buffer.getvalue())


def main() -> None:
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    images, shards = work / "images", work / "pixel-shards"
    make_image_folder(images)
    manifest = build_shards(images, shards, pixels="short=64", max_samples_per_shard=32)
    per_sample = manifest.num_bytes / manifest.num_samples
    print(f"{manifest.num_samples} samples as pixels in {len(manifest.shards)} shards, "
          f"{per_sample / 1000:.1f} KB per sample")  # fmt: skip

    with tarfile.open(shards / manifest.shards[0].name) as archive:  # any tool reads them
        member = next(m for m in archive if m.name.endswith(".pixels.npy"))
        stored = np.load(io.BytesIO(archive.extractfile(member).read()))  # type: ignore[union-attr]
    print(f"{member.name}: {stored.dtype} {stored.shape}")

    transform = v2.Compose([
        v2.RandomResizedCrop(48, antialias=True),
        v2.RandomHorizontalFlip(),
        v2.ToDtype(torch.float32, scale=True),
        v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])  # fmt: skip
    dataset = StreamingDataset(shards, batch_size=16, decode="rgb8", transform=transform)
    loader = StreamingDataLoader(dataset, num_workers=2)
    for epoch in range(2):
        dataset.set_epoch(epoch)
        count = 0
        for images_batch, labels in loader:
            assert images_batch.shape == (16, 3, 48, 48)
            count += len(labels)
        print(f"epoch {epoch}: {count} crops of 48x48 from stored pixels")


if __name__ == "__main__":
    main()
