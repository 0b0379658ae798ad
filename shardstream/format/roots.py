"""Where a manifest's shards and indexes are (its folder, or the roots it names), and which of
their samples it keeps (a view's selection)."""

from __future__ import annotations

import os
import posixpath
from typing import TYPE_CHECKING

import numpy as np

from shardstream.errors import ManifestError
from shardstream.format.selection import Selection
from shardstream.storage import Store

if TYPE_CHECKING:
    from shardstream.format.manifest import Manifest

__all__ = ["absolute_root", "root_store", "view_selection"]


def root_store(dataset: Store, root: str | None) -> Store:
    """The store of a manifest's ``shard_root``/``index_root`` (relative to the dataset).

    Examples:
        >>> root_store(Store("/data/view"), "../train").root
        '/data/train'
    """
    if root is None:
        return dataset
    if "://" not in root and not os.path.isabs(root):
        base = dataset.url()
        scheme, sep, path = base.rpartition("://")
        joined = posixpath.normpath(posixpath.join(path, root))
        root = f"{scheme}{sep}{joined}" if sep else os.path.normpath(os.path.join(base, root))
    return Store(root, dataset.storage_options, dataset.read_options)


def absolute_root(store: Store) -> str:
    """A store's root as another manifest names it (local paths made absolute)."""
    url = store.url()
    return os.path.abspath(url) if store.is_local and "://" not in url else url


def view_selection(dataset: Store, manifest: Manifest) -> Selection | None:
    """The samples a view keeps (None for a dataset that is not a view), its key list read."""
    if manifest.view is None:
        return None
    if manifest.index_root is None and manifest.shard_root is None:
        raise ManifestError(f"{dataset.shown()}: a view must name its source's shards")
    select = dict(manifest.view["select"])
    if select.get("kind") == "where":  # a view by fields keeps samples by its exclusion list
        return None
    keys = None
    if select.get("kind") == "keys":
        data = dataset.read_bytes(str(select.get("file")))
        keys = np.frombuffer(data, dtype="<i8").astype(np.int64)
    return Selection.from_dict(select, keys, dataset.shown())
