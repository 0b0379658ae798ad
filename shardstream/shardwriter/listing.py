"""Which shards a source names: a folder's tars, a brace pattern, or a list of URLs."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import braceexpand

from shardstream.errors import ConfigError
from shardstream.storage import Store

__all__ = ["SHARD_SUFFIXES", "list_shards"]

SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")

ShardSource = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


def list_shards(
    source: ShardSource, storage_options: Mapping[str, Any] | None = None
) -> tuple[Store, list[str]]:
    """The store the shards are named in, and their names (sorted for a folder).

    Args:
        source: A folder or URL prefix (its ``.tar``, ``.tar.gz`` and ``.tgz`` files), a
            brace pattern such as ``"s3://b/{00000..00099}.tar"``, a ``.txt`` file listing one
            shard URL per line, or a list of shard URLs.
        storage_options: fsspec options for remote URLs.

    Raises:
        ConfigError: The source names no shards, or shards on different storage.

    Example:
        >>> store, names = list_shards("d/{0..1}.tar")
        >>> store.root, names
        ('d', ['0.tar', '1.tar'])
    """
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if "{" in text or text.endswith(SHARD_SUFFIXES):
            urls = list(braceexpand.braceexpand(text))
        elif text.endswith(".txt"):
            lines = Store(text, storage_options).read_bytes("").decode("utf-8").splitlines()
            urls = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
        else:
            store = Store(text, storage_options)
            names = sorted(name for name in store.list_names() if name.endswith(SHARD_SUFFIXES))
            if not names:
                raise ConfigError(f"{store.shown()}: holds no .tar, .tar.gz or .tgz shards")
            return store, names
    else:
        urls = [os.fspath(url) for url in source]
    if not urls:
        raise ConfigError(f"{source!r} names no shards; pass a folder, a pattern or a URL list")
    return Store.for_urls(urls, storage_options)
