"""The manifest of a view: the source's shards, read where the source keeps them, with the
counts the view keeps and what it selected (by keys, splits or a predicate over fields)."""

from __future__ import annotations

from typing import Any

import numpy as np

from shardstream._version import __version__
from shardstream.format.exclusions import Exclusions
from shardstream.format.manifest import Manifest
from shardstream.format.roots import absolute_root, root_store
from shardstream.format.shardtable import ShardTable
from shardstream.storage import Store


def view_manifest(
    origin: Store, manifest: Manifest, counts: np.ndarray, select: dict[str, Any],
    exclusions: Exclusions | None, columns: Any,
) -> Manifest:  # fmt: skip
    """A view of ``manifest`` (read from ``origin``) keeping ``counts`` samples per shard."""
    table = manifest.shards
    return Manifest(
        shards=ShardTable(table.names, counts, table.num_bytes, table.sha256, table.indexes),
        class_names=manifest.class_names,
        settings={"view_of": origin.shown()},
        created_by=f"shardstream {__version__} view",
        shard_root=absolute_root(root_store(origin, manifest.shard_root)),
        index_root=absolute_root(root_store(origin, manifest.index_root)),
        view={
            "source": origin.shown(),
            "source_root": absolute_root(origin),
            "source_version": manifest.version,
            "select": select,
        },
        exclusions=exclusions,
        columns=columns,
    )
