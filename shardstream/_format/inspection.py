"""What ``shardstream inspect`` shows beyond the manifest's totals: how evenly samples and
bytes spread over the shards, how balanced the classes are (read from a sample of shards),
and which files other tools look for are present.

timm's ``_info.json``: lets ``timm.data.create_dataset("wds/...")`` read a shardstream dataset.

timm's WebDataset reader (``timm/data/readers/reader_wds.py``) finds its shards and sample count
in ``ROOT/_info.json``: ``info["splits"][split]`` must hold ``name``, ``num_samples``,
``filenames`` (shard names relative to ROOT, no brace patterns) and ``shard_lengths``. Without
the file, timm needs the shards spelled out in ``split`` and refuses to train
(``num_samples not specified``). Labels come from the ``.cls`` members, which shardstream
writes as ASCII integers, and images from the first of ``jpg``, ``png``, ``webp``.

:func:`~shardstream.build_shards` writes the file from the manifest, just before the
manifest itself, so a finished dataset always has both. Its bytes depend only on the manifest's
shard list (no timestamps, no paths, sorted keys), so a resumed or repeated build writes the
same bytes. The one split is called ``"train"`` whatever the dataset holds: the name only has to
match ``split=`` in timm, and it must not depend on DEST, which stays out of the output."""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from shardstream._format import codecs
from shardstream._format.exclusions import Selection
from shardstream._format.keys import key_hash
from shardstream._format.manifest import Manifest, root_store, view_selection
from shardstream._format.shardindex import decode_index
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream._storage import StorageOptions, Store, as_store
from shardstream.errors import ConfigError, DecodeError, ShardFormatError

__all__ = [
    "TIMM_INFO_NAME",
    "TIMM_SPLIT",
    "class_balance",
    "companion_files",
    "pixel_sizes",
    "shard_spread",
    "timm_info_json",
    "write_timm_info",
]


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
        >>> from shardstream._format.manifest import ShardInfo
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


#: The first name timm's reader tries (``_info.json``, then ``info.json``).
TIMM_INFO_NAME = "_info.json"
#: The split name written by ``build_shards``: ``create_dataset(..., split="train")``.
TIMM_SPLIT = "train"


def timm_info_json(manifest: Manifest, split: str = TIMM_SPLIT) -> str:
    """The text of timm's ``_info.json`` for a dataset: one split holding every shard.

    Args:
        manifest: The dataset's manifest; shard names and counts are taken from it, in order.
        split: The split name to pass as ``create_dataset(..., split=...)``.

    Returns:
        JSON text with sorted keys and a final newline, identical for identical shard lists.

    Raises:
        ConfigError: ``split`` is empty, or contains ``tar`` or ``..`` (timm would read such a
            split as a shard pattern and never look it up in the file).

    Examples:
        >>> from shardstream import ShardInfo
        >>> shards = (ShardInfo("shard-000000.tar", 5, 10240, "0" * 64),)
        >>> info = json.loads(timm_info_json(Manifest(shards=shards)))
        >>> info["splits"]["train"]["shard_lengths"], info["splits"]["train"]["num_samples"]
        ([5], 5)
    """
    if not split or "tar" in split or ".." in split:
        raise ConfigError(
            f"timm split name {split!r} cannot be used: it must be non-empty and contain neither "
            "'tar' nor '..', which timm reads as a shard pattern. Use e.g. 'train' or 'validation'."
        )
    stored = manifest.stored_samples()  # timm reads every sample a file holds
    entry = {
        "filenames": [shard.name for shard in manifest.shards],
        "name": split,
        "num_samples": int(stored.sum()),
        "shard_lengths": stored.tolist(),
    }
    return json.dumps({"splits": {split: entry}}, indent=1, sort_keys=True) + "\n"


def write_timm_info(
    dataset: Store | str | os.PathLike[str],
    manifest: Manifest,
    storage_options: StorageOptions = None,
    split: str = TIMM_SPLIT,
) -> str:
    """Atomically write timm's ``_info.json`` into a dataset folder, URL or store.

    ``build_shards`` calls this itself. Call it for a dataset built before shardstream wrote the
    file, or to name the split otherwise (a rebuild with ``overwrite`` writes ``"train"`` again).

    Args:
        dataset: The dataset folder, URL prefix or :class:`~shardstream.Store`.
        manifest: The dataset's manifest.
        storage_options: Passed to fsspec when ``dataset`` is a URL.
        split: The split name, see :func:`timm_info_json`.

    Returns:
        The URL of the file written.

    Examples:
        >>> from shardstream import read_manifest
        >>> write_timm_info("shards/val", read_manifest("shards/val"),
        ...                 split="validation")  # doctest: +SKIP
        'shards/val/_info.json'
    """
    text = timm_info_json(manifest, split)
    store = as_store(dataset, storage_options)
    with store.open_atomic_write(TIMM_INFO_NAME) as stream:
        stream.write(text.encode("utf-8"))
    return store.url(TIMM_INFO_NAME)
