"""One partition of a build spread over an existing engine: :func:`write_partition`.

Each task writes its samples as a complete small dataset in ``DEST/part-NNNNN``; when all are
done, :func:`~shardstream.merge_partitions` writes the dataset's manifest over them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from shardstream.catalog.partitionmerge import partition_folder
from shardstream.format.manifest import Manifest
from shardstream.shardwriter.build import build_shards
from shardstream.shardwriter.options import BuildOptions
from shardstream.storage import Store

__all__ = ["write_partition"]


def write_partition(
    samples: Iterable[Mapping[str, Any]],
    dest: str | os.PathLike[str],
    partition: int,
    options: BuildOptions | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Manifest:
    """Write one partition's samples as shards into ``dest/part-NNNNN`` (replacing a retry's).

    Args:
        samples: Sample dicts as :func:`~shardstream.build_shards` takes them
            (``{"__key__": ..., "jpg": bytes, "cls": 3}``), in the order to write them.
        dest: The dataset folder or URL shared by all partitions.
        partition: This task's partition number (Spark's partition id, Ray's batch or block
            number, ``SLURM_ARRAY_TASK_ID``): the same number on a retry.
        options: Shard limits and encoding, as for ``build_shards`` (``overwrite`` is implied).
        storage_options: fsspec options for ``dest``.
        **overrides: Any :class:`BuildOptions` field.

    Returns:
        The partition's own manifest.

    Examples:
        >>> def task(rows, partition):  # doctest: +SKIP
        ...     samples = ({"__key__": r["id"], "jpg": r["image"], "cls": r["label"]} for r in rows)
        ...     write_partition(samples, "s3://bucket/train", partition, workers=1)
    """
    options = options or BuildOptions()
    merged = {"workers": 1, **overrides, "overwrite": True}
    folder = Store(dest, storage_options).url(partition_folder(partition))
    return build_shards(samples, folder, options, storage_options=storage_options, **merged)
