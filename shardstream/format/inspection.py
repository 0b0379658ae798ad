"""What ``shardstream inspect`` shows beyond the manifest's totals: how evenly samples and
bytes spread over the shards, how balanced the classes are (read from a sample of shards),
and which files other tools look for are present."""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import Any

import numpy as np

from shardstream.errors import DecodeError, ShardFormatError
from shardstream.format import codecs
from shardstream.format.keys import key_hash
from shardstream.format.manifest import Manifest
from shardstream.format.roots import root_store, view_selection
from shardstream.format.samples import iter_samples
from shardstream.format.selection import Selection
from shardstream.format.shardindex import decode_index
from shardstream.format.tarreader import open_tar
from shardstream.storage import Store

__all__ = ["class_balance", "companion_files", "pixel_sizes", "shard_spread"]

#: Files other readers look for, and who reads them.
COMPANIONS = {
    "_info.json": "timm (split sizes for its WebDataset reader)",
    "manifest.shards": "shardstream (binary shard table, above 10,000 shards)",
    "README.md": "Hugging Face Hub (dataset card)",
    "dataset_info.json": "Hugging Face datasets",
}


def shard_spread(manifest: Manifest) -> dict[str, dict[str, float]]:
    """Min, median and max of samples and of bytes per shard.

    Examples:
        >>> from shardstream.format.manifest import ShardInfo
        >>> m = Manifest(shards=[ShardInfo(f"s{i}.tar", i + 1, 4096 * (i + 1)) for i in range(3)])
        >>> shard_spread(m)["samples"]
        {'min': 1.0, 'median': 2.0, 'max': 3.0}
    """
    spread = {}
    for name, column in (("samples", manifest.shards.num_samples),
                         ("bytes", manifest.shards.num_bytes)):  # fmt: skip
        values = np.asarray(column, dtype=np.float64)
        if values.size == 0:
            values = np.zeros(1)
        spread[name] = {"min": float(values.min()), "median": float(np.median(values)),
                        "max": float(values.max())}  # fmt: skip
    return spread


def class_balance(
    dataset: Store, manifest: Manifest, max_shards: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Samples per label in up to ``max_shards`` shards spread evenly over the dataset.

    Reads those shards whole (their ``.cls`` members give the labels), so the cost is their
    bytes: with every shard read the counts are exact, else an estimate from the sample.
    ``progress(shards_read, shards_to_read)`` is called after each shard.
    """
    shards = root_store(dataset, manifest.shard_root)
    selection = view_selection(dataset, manifest)  # a view counts only the samples it keeps
    total = len(manifest.shards)
    numbers = sorted({int(i) for i in np.linspace(0, total - 1, min(max_shards, total))})
    counts: collections.Counter[int] = collections.Counter()
    unlabelled = 0
    for done, number in enumerate(numbers):
        if progress is not None:
            progress(done, len(numbers))
        name = manifest.shards[number].name
        excluded = set() if manifest.exclusions is None else set(
            manifest.exclusions.positions(number).tolist()
        )  # fmt: skip
        with shards.open_read(name) as stream:
            samples = iter_samples(open_tar(stream, shards.shown(name)))
            for position, (sample, _) in enumerate(samples):
                if position in excluded:
                    continue
                if selection is not None and not _kept(selection, sample["__key__"]):
                    continue
                label = _label(sample.get("cls"))
                if label is None:
                    unlabelled += 1
                else:
                    counts[label] += 1
    if progress is not None:
        progress(len(numbers), len(numbers))
    return {"shards_read": len(numbers), "shards": total, "counts": dict(sorted(counts.items())),
            "unlabelled": unlabelled}  # fmt: skip


def _kept(selection: Selection, key: str) -> bool:
    return bool(selection.keep(np.array([key_hash(key)], dtype=np.int64))[0])


def _label(raw: Any) -> int | None:
    """A ``.cls`` member's label, or None when there is none or it is not an integer."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        return None
    try:
        return int(codecs.decode_member("cls", bytes(raw)))
    except (DecodeError, ValueError):
        return None


def companion_files(dataset: Store) -> dict[str, str]:
    """The files of :data:`COMPANIONS` that ``dataset`` holds, with who reads them."""
    return {name: reader for name, reader in COMPANIONS.items() if dataset.exists(name)}


def pixel_sizes(dataset: Store, manifest: Manifest) -> dict[str, Any] | None:
    """Height and width range of the pixel images of the first shard, from its index alone.

    Returns:
        ``{"shard", "samples", "height": (min, max), "width": (min, max)}``, or None when the
        first shard's index records no pixel sizes (encoded images, or an index written by
        ``shardstream index``/``compact``).
    """
    if not len(manifest.shards) or not manifest.shards[0].index:
        return None
    shards = root_store(dataset, manifest.shard_root)
    name = manifest.shards[0].index
    try:
        shapes = decode_index(shards.read_bytes(name), shards.shown(name)).shapes
    except (OSError, ShardFormatError):
        return None
    if shapes is None or not len(shapes):
        return None
    heights, widths = shapes[:, 0], shapes[:, 1]
    return {"shard": manifest.shards[0].name, "samples": len(shapes),
            "height": (int(heights.min()), int(heights.max())),
            "width": (int(widths.min()), int(widths.max()))}  # fmt: skip
