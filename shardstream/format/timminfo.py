"""timm's ``_info.json``: lets ``timm.data.create_dataset("wds/...")`` read a shardstream dataset.

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
match ``split=`` in timm, and it must not depend on DEST, which stays out of the output.
"""

from __future__ import annotations

import json
import os

from shardstream.errors import ConfigError
from shardstream.format.manifest import Manifest
from shardstream.storage import StorageOptions, Store, as_store

__all__ = ["TIMM_INFO_NAME", "TIMM_SPLIT", "timm_info_json", "write_timm_info"]

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
