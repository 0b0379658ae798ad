"""Benchmark data, generated once and cached under ``bench-data/`` (ignored by git).

``imagenet_like`` writes an ImageFolder tree of realistic JPEGs (smooth content plus fine noise,
sides 300-640 px, about 100 KB each, like ImageNet's training images). ``tiny_tree`` writes a
very large tree of identical tiny JPEG files, for start-up and scaling rows.
"""

from __future__ import annotations

import io
import os
import pathlib
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

DATA_ROOT = pathlib.Path(os.environ.get("SHARDSTREAM_BENCH_DATA", "bench-data")).resolve()


def realistic_jpeg(seed: int) -> bytes:
    """One ImageNet-like JPEG: smooth shapes and texture, random size, quality 90."""
    rng = np.random.default_rng(seed)
    width, height = int(rng.integers(300, 641)), int(rng.integers(240, 481))
    coarse = rng.integers(0, 256, size=(6, 8, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(coarse, "RGB").resize((width, height), Image.BICUBIC))
    texture = rng.normal(0, 14, size=(height, width, 3))
    pixels = np.clip(smooth + texture, 0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _write_class(args: tuple[pathlib.Path, int, int, int]) -> int:
    root, label, start, count = args
    folder = root / f"n{label:08d}"
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(start, start + count):
        (folder / f"n{label:08d}_{index}.JPEG").write_bytes(realistic_jpeg(index))
    return count


def imagenet_like(num_images: int = 20_000, num_classes: int = 100) -> pathlib.Path:
    """An ImageFolder tree of ``num_images`` realistic JPEGs in ``num_classes`` classes."""
    root = DATA_ROOT / f"imagenet-like-{num_images}-{num_classes}"
    if (root / ".complete").exists():
        return root
    per_class = -(-num_images // num_classes)
    jobs, start = [], 0
    for label in range(num_classes):
        count = min(per_class, num_images - start)
        if count <= 0:
            break
        jobs.append((root, label, start, count))
        start += count
    with ProcessPoolExecutor(max_workers=os.cpu_count()) as pool:
        list(pool.map(_write_class, jobs))
    (root / ".complete").write_text(str(num_images))
    return root


def tiny_tree(num_files: int = 1_000_000, files_per_folder: int = 1000) -> pathlib.Path:
    """A tree of ``num_files`` identical tiny JPEGs, ``files_per_folder`` per class folder."""
    root = DATA_ROOT / f"tiny-{num_files}"
    if (root / ".complete").exists():
        return root
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 30, 200)).save(buffer, format="JPEG")
    data = buffer.getvalue()
    for index in range(num_files):
        folder = root / f"c{index // files_per_folder:05d}"
        if index % files_per_folder == 0:
            folder.mkdir(parents=True, exist_ok=True)
        with open(folder / f"{index:08d}.jpg", "wb") as stream:
            stream.write(data)
    (root / ".complete").write_text(str(num_files))
    return root
