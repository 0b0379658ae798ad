"""Sources -> shard lists: a dataset folder with a manifest, a brace pattern, or a list of URLs."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import braceexpand
import numpy as np

from shardstream.errors import ConfigError
from shardstream.format.manifest import Manifest, read_manifest
from shardstream.format.shardtable import NameColumn, ShardTable
from shardstream.storage import ReadOptions, StorageOptions, Store

__all__ = ["ShardList", "ShardSpec", "Source", "resolve_source"]

_SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.zst")
Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """One shard to read.

    Attributes:
        name: The shard's name in its store (a full URL when the store has no common root).
        num_samples: Samples in the shard from the manifest, or None when unknown.
        index: The name of the shard's byte-offset index (from the manifest), or None.
        num_bytes: The shard's size in bytes from the manifest, or None when unknown.
        store: Which of the dataset's stores holds it (its stream, in a mixture).
    """

    name: str
    num_samples: int | None = None
    index: str | None = None
    num_bytes: int | None = None
    store: int = 0


class ShardList:
    """The shards a dataset reads, from one or more stores (a mixture has one per stream).

    Shards are numbered across the stores in order. Counts come from the stores' manifests as
    arrays (nothing per shard is built until a worker opens that shard), so a dataset of a
    million shards costs a few arrays, shared by forked DataLoader workers.

    Args:
        stores: Where the shards are.
        tables: Per store, its manifest's shard table, or the shard names alone (no manifest:
            counts unknown).
    """

    def __init__(self, stores: Sequence[Store], tables: Sequence[ShardTable | NameColumn]) -> None:
        if len(stores) != len(tables):
            raise ConfigError("a shard list needs one table per store")
        self.stores, self.tables = tuple(stores), tuple(tables)
        sizes = [len(table) for table in self.tables]
        self.firsts = np.zeros(len(sizes) + 1, dtype=np.int64)
        np.cumsum(sizes, out=self.firsts[1:])

    @property
    def counted(self) -> bool:
        """Whether every shard's sample count is known (every store has a manifest)."""
        return all(isinstance(table, ShardTable) for table in self.tables)

    def __len__(self) -> int:
        return int(self.firsts[-1])

    def counts(self, store: int | None = None) -> np.ndarray:
        """Samples per shard (of one store, or of all), as an ``int64`` array."""
        tables = self.tables if store is None else [self.tables[store]]
        arrays = [table.num_samples for table in tables if isinstance(table, ShardTable)]
        if len(arrays) != len(tables):
            raise ConfigError("sample counts are unknown: a source has no manifest")
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    def spec(self, shard: int) -> ShardSpec:
        """Shard number ``shard``: its name, store, and what its manifest says."""
        store = int(np.searchsorted(self.firsts, shard, side="right")) - 1
        table, local = self.tables[store], shard - int(self.firsts[store])
        if isinstance(table, NameColumn):
            return ShardSpec(table[local], store=store)
        info = table[local]
        return ShardSpec(info.name, info.num_samples, info.index, info.num_bytes, store)


def resolve_source(
    source: Source,
    storage_options: StorageOptions = None,
    read_options: ReadOptions | None = None,
) -> tuple[Store, ShardList, Manifest | None]:
    """Expand a source into a store and its shards, reading the manifest of a dataset folder.

    Args:
        source: A dataset folder or URL prefix holding ``manifest.json``; a shard URL or brace
            pattern such as ``"s3://b/train-{000000..001023}.tar"``; or a list of shard URLs.
        storage_options: fsspec options (credentials, endpoint) for remote URLs.
        read_options: Retries, read-ahead and cache for reading the shards.

    Returns:
        The store the shards are named in, the shards, and the manifest (None for patterns
        and lists: counts are unknown).

    Raises:
        ManifestNotFoundError: A folder without ``manifest.json``.
        ConfigError: The source expands to no shards, or to shards on different storage.

    Example:
        >>> store, shards, _ = resolve_source("d/train-{0..1}.tar")
        >>> store.root, [shards.spec(i).name for i in range(len(shards))]
        ('d', ['train-0.tar', 'train-1.tar'])
    """
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if "{" in text or text.endswith(_SHARD_SUFFIXES):
            urls = list(braceexpand.braceexpand(text))
        else:
            store = Store(text, storage_options, read_options)
            manifest = read_manifest(store)
            if not len(manifest.shards):
                raise ConfigError(f"{store.shown()}: the manifest lists no shards")
            return store, ShardList([store], [manifest.shards]), manifest
    else:
        urls = [os.fspath(url) for url in source]
    if not urls:
        raise ConfigError(f"{source!r} names no shards; pass a folder, a pattern or a URL list")
    store, names = Store.for_urls(urls, storage_options, read_options)
    return store, ShardList([store], [NameColumn.of(names)]), None
