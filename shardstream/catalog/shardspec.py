"""One dataset's shards as readers see them: a shard to read, and where a source's shards are.

:class:`ShardSpec` is one shard as a worker opens it; :class:`ShardSource` is one dataset (one
stream of a mixture): its stores, its shard table, and which stored samples it reads (a view's
selection, a version's exclusions). :mod:`shardstream.catalog.shardlist` numbers the shards of
one or more sources.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from shardstream.errors import ConfigError
from shardstream.format.columns import ColumnSet
from shardstream.format.exclusions import Exclusions
from shardstream.format.selection import Selection
from shardstream.format.shardtable import NameColumn, ShardTable
from shardstream.storage import Store

__all__ = ["ShardSource", "ShardSpec"]


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """One shard to read.

    Attributes:
        name: The shard's name in its store (a full URL when the store has no common root).
        num_samples: Samples to read from it (a view's kept samples), or None when unknown.
        index: The name of the shard's byte-offset index (from the manifest), or None.
        num_bytes: The shard's size in bytes from the manifest, or None when unknown.
        store_index: Which source of the list holds it (its number in ``ShardList.sources``;
            its stream, in a mixture).
        excluded: Samples the file stores that the version excludes (``num_samples`` counts
            the others); readers skip them (:meth:`ShardSource.kept`).
    """

    name: str
    num_samples: int | None = None
    index: str | None = None
    num_bytes: int | None = None
    store_index: int = 0
    excluded: int = 0


@dataclasses.dataclass(frozen=True)
class ShardSource:
    """One dataset's shards: where they and their indexes are, and which samples to read.

    Attributes:
        shards: The store shard names are relative to.
        indexes: The store index names are relative to.
        table: The manifest's shard table, or the names alone (no manifest: counts unknown).
        selection: For a view, the samples it keeps (read through the shards' indexes).
        exclusions: The stored samples the version leaves out (``shardstream exclude``).
        columns: Where the fields attached by key are, and what they are (``attach``).
    """

    shards: Store
    indexes: Store
    table: ShardTable | NameColumn
    selection: Selection | None = None
    exclusions: Exclusions | None = None
    columns: tuple[Store, ColumnSet] | None = None

    def kept(self, shard: int, stored: int, key_hashes: np.ndarray | None) -> np.ndarray:
        """The stored positions read of shard ``shard`` (its number in this source) of
        ``stored`` samples: a view's selection by ``key_hashes``, less the excluded ones."""
        if self.selection is not None:
            if key_hashes is None:
                raise ConfigError("a view keeps samples by their key hashes")
            keep = self.selection.keep(key_hashes)
            if self.exclusions is not None:
                keep[self.exclusions.positions(shard)] = False
            return np.flatnonzero(keep)
        if self.exclusions is None:
            return np.arange(stored)
        return self.exclusions.kept(shard, stored)
