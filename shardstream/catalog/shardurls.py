"""Shard URLs from what a user wrote: brace patterns and globs expanded, ``.txt`` lists read
(relative entries relative to the list's folder), local shards that are not there refused.

:func:`~shardstream.catalog.shardlist.resolve_source` calls these, so a pattern or list that
names no shard, or a local shard that is missing, is refused when the dataset is made, with the
pattern and examples named, rather than in a DataLoader worker mid-epoch.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import braceexpand

from shardstream.errors import ConfigError, ShardNotFoundError
from shardstream.storage import StorageOptions, Store, is_local_url
from shardstream.storage.patterns import (
    expand_glob,
    has_glob,
    missing_local_files,
    resolve_entry,
)

__all__ = ["SHARD_URL_SUFFIXES", "expand_pattern", "read_url_list", "refuse_missing"]

#: Names that are one shard's URL (not a folder), with ``.tar.zst`` read by the streaming side.
SHARD_URL_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst")


def expand_pattern(text: str, storage_options: StorageOptions) -> list[str]:
    """A brace pattern's URLs, with each glob among them replaced by the shards it matches."""
    urls: list[str] = []
    for url in braceexpand.braceexpand(text):
        if not has_glob(url):
            urls.append(url)
            continue
        matched = [name for name in expand_glob(url, storage_options) if name.endswith(
            SHARD_URL_SUFFIXES)]  # fmt: skip
        if not matched:
            raise ConfigError(
                f"{url!r} matches no .tar, .tar.gz, .tgz or .tar.zst file; check the folder "
                "and the pattern, or name the shards with a brace pattern such as "
                "'ds/shard-{000000..000099}.tar'"
            )
        urls.extend(matched)
    return urls


def read_url_list(url: str, storage_options: StorageOptions) -> list[str]:
    """The shard URLs of a ``.txt`` file: one a line, blank lines and ``#`` comments skipped,
    relative entries relative to the file's folder."""
    listing = Store(url, storage_options)
    try:
        text = listing.read_bytes("").decode("utf-8")
    except FileNotFoundError:
        raise ConfigError(
            f"{listing.shown()}: the shard list does not exist; check the path (a .txt source "
            "is a file of shard URLs, one a line)"
        ) from None
    lines = (line.strip() for line in text.splitlines())
    return [resolve_entry(line, url) for line in lines if line and not line.startswith("#")]


def refuse_missing(urls: Sequence[str], source: Any) -> None:
    """Refuse local shards that are not there, naming a few and what named them."""
    local = [url for url in urls if is_local_url(url)]
    paths = [url[len("file://") :] if url.startswith("file://") else url for url in local]
    missing = missing_local_files(paths)
    if not missing:
        return
    named = f"{os.fspath(source)!r}" if isinstance(source, (str, os.PathLike)) else "the list"
    examples = ", ".join(repr(path) for path in missing[:3])
    raise ShardNotFoundError(
        f"{len(missing)} of the {len(urls)} shards that {named} names do not exist, such as "
        f"{examples}; fix the pattern or the list (a brace range's ends, the folder), or "
        "remove the missing shards from it"
    )
