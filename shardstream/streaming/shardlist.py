"""Sources -> shard lists: a dataset folder with a manifest, a brace pattern, or a list of URLs."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import braceexpand

from shardstream import _fs
from shardstream.errors import ConfigError
from shardstream.manifest import Manifest, read_manifest

__all__ = ["ShardSpec", "resolve_source"]

_SHARD_SUFFIXES = (".tar", ".tgz", ".tar.gz", ".tar.zst")
Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """One shard to read.

    Attributes:
        url: Local path or fsspec URL.
        num_samples: Samples in the shard from the manifest, or None when unknown.
        index_url: The shard's byte-offset index (from the manifest), or None.
        num_bytes: The shard's size in bytes from the manifest, or None when unknown.
    """

    url: str
    num_samples: int | None = None
    index_url: str | None = None
    num_bytes: int | None = None


def resolve_source(
    source: Source, storage_options: _fs.StorageOptions = None
) -> tuple[tuple[ShardSpec, ...], Manifest | None]:
    """Expand a source into shards, reading the manifest when the source is a dataset folder.

    Args:
        source: A dataset folder or URL prefix holding ``manifest.json``; a shard URL or brace
            pattern such as ``"s3://b/train-{000000..001023}.tar"``; or a list of shard URLs.
        storage_options: fsspec options (credentials, endpoint) for remote URLs.

    Returns:
        The shards, and the manifest (None for patterns and lists: counts are unknown).

    Raises:
        ManifestNotFoundError: A folder without ``manifest.json``.
        ConfigError: The source expands to no shards.

    Example:
        >>> [s.url for s in resolve_source("d/train-{0..1}.tar")[0]]
        ['d/train-0.tar', 'd/train-1.tar']
    """
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if "{" in text or text.endswith(_SHARD_SUFFIXES):
            urls = list(braceexpand.braceexpand(text))
        else:
            manifest = read_manifest(text, storage_options)
            shards = tuple(
                ShardSpec(
                    _fs.join(text, shard.name),
                    shard.num_samples,
                    _fs.join(text, shard.index) if shard.index else None,
                    shard.num_bytes,
                )
                for shard in manifest.shards
            )
            if not shards:
                raise ConfigError(f"{text}: the manifest lists no shards")
            return shards, manifest
    else:
        urls = [os.fspath(url) for url in source]
    if not urls:
        raise ConfigError(f"{source!r} names no shards; pass a folder, a pattern or a URL list")
    return tuple(ShardSpec(url) for url in urls), None
