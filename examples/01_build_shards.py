"""Build WebDataset shards from a small ImageFolder tree of real JPEGs, then verify them.

Run: python examples/01_build_shards.py   (writes under $SHARDSTREAM_EXAMPLE_DIR or a temp dir)
"""

from __future__ import annotations

import io
import os
import pathlib
import tempfile

import numpy as np
from PIL import Image

from shardstream import build_shards, verify_dataset


def make_image_folder(root: pathlib.Path, num_classes: int = 4, per_class: int = 25) -> None:
    rng = np.random.default_rng(0)
    for label in range(num_classes):
        folder = root / f"class_{label}"
        folder.mkdir(parents=True, exist_ok=True)
        for index in range(per_class):
            pixels = rng.integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
            buffer = io.BytesIO()
            Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=85)
            (folder / f"img_{index:03d}.jpg").write_bytes(buffer.getvalue())


def main() -> None:
    work = pathlib.Path(os.environ.get("SHARDSTREAM_EXAMPLE_DIR") or tempfile.mkdtemp())
    images, shards = work / "images", work / "shards"
    make_image_folder(images)
    manifest = build_shards(images, shards, max_samples_per_shard=30, seed=0, workers=2)
    verify_dataset(str(shards))
    print(
        f"{manifest.num_samples} samples in {len(manifest.shards)} shards "
        f"({manifest.num_bytes / 1e6:.2f} MB), classes {manifest.class_names}"
    )
    for shard in manifest.shards:
        print(f"  {shard.name}: {shard.num_samples} samples, {shard.num_bytes} bytes")


if __name__ == "__main__":
    main()
