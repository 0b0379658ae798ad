"""Sources -> shard lists: a dataset folder with a manifest, a brace pattern, or a list of URLs."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import braceexpand

from shardstream.errors import ConfigError
from shardstream.format.manifest import Manifest, read_manifest
from shardstream.storage import ReadOptions, StorageOptions, Store

__all__ = ["ShardSpec", "Source", "resolve_source"]

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


def resolve_source(
    source: Source,
    storage_options: StorageOptions = None,
    read_options: ReadOptions | None = None,
) -> tuple[Store, tuple[ShardSpec, ...], Manifest | None]:
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
        >>> store.root, [s.name for s in shards]
        ('d', ['train-0.tar', 'train-1.tar'])
    """
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if "{" in text or text.endswith(_SHARD_SUFFIXES):
            urls = list(braceexpand.braceexpand(text))
        else:
            store = Store(text, storage_options, read_options)
            manifest = read_manifest(store)
            shards = tuple(
                ShardSpec(shard.name, shard.num_samples, shard.index, shard.num_bytes)
                for shard in manifest.shards
            )
            if not shards:
                raise ConfigError(f"{store.shown()}: the manifest lists no shards")
            return store, shards, manifest
    else:
        urls = [os.fspath(url) for url in source]
    if not urls:
        raise ConfigError(f"{source!r} names no shards; pass a folder, a pattern or a URL list")
    store, names = Store.for_urls(urls, storage_options, read_options)
    return store, tuple(ShardSpec(name) for name in names), None
