"""Helpers that write small real shard datasets for the streaming tests."""

from __future__ import annotations

import functools
import pathlib
from typing import Any

from shardstream._format.manifest import Manifest
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream.shardwriter import build_shards
from tests.conftest import encode_image


@functools.lru_cache(maxsize=64)
def tiny_jpeg(index: int, width: int = 16, height: int = 12) -> bytes:
    """A real tiny JPEG whose content depends on ``index``."""
    return encode_image(width, height, seed=index)


def make_samples(
    num_samples: int, num_classes: int = 4, class_order: bool = True
) -> list[dict[str, Any]]:
    """Samples ``{"__key__", "jpg", "cls", "json"}``; labels in blocks (class order) or cycling."""
    per_class = -(-num_samples // num_classes)
    samples = []
    for index in range(num_samples):
        label = index // per_class if class_order else index % num_classes
        samples.append(
            {
                "__key__": f"s{index:06d}",
                "jpg": tiny_jpeg(index % 16),
                "cls": label,
                "json": {"index": index},
            }
        )
    return samples


def make_dataset(
    root: pathlib.Path,
    num_samples: int = 40,
    per_shard: int = 7,
    num_classes: int = 4,
    class_order: bool = True,
) -> tuple[pathlib.Path, Manifest]:
    """Build a shardstream dataset (tar shards + manifest) with ``build_shards``."""
    dest = root / f"ds-{num_samples}-{per_shard}-{num_classes}-{int(class_order)}"
    manifest = build_shards(
        make_samples(num_samples, num_classes, class_order), dest, max_samples_per_shard=per_shard
    )
    return dest, manifest


def keys_of(batches: Any) -> list[str]:
    """Sample keys from ``output="dict"`` items (single samples or batches)."""
    keys: list[str] = []
    for item in batches:
        value = item["__key__"]
        keys.extend(value if isinstance(value, list) else [value])
    return keys


def sample_offsets(path: pathlib.Path) -> list[int]:
    """A tar's offsets as a shardstream index lists them: where each sample starts, then where
    its last member ends (before the end-of-archive blocks)."""
    with open(path, "rb") as stream:
        offsets = [offset for _, offset in iter_samples(open_tar(stream, str(path)), False)]
        stream.seek(0)
        reader = open_tar(stream, str(path))
        end = 0
        while reader.next_member() is not None:
            end = reader.offset
    return [*offsets, end]
