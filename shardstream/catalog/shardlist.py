"""Sources -> shard lists: the one function every entry point turns a source into shards with.

:func:`resolve_source` takes any of these forms; ``index``, ``StreamingDataset``, random
access and mixtures call it, and views, ``inspect`` and ``verify`` call :func:`read_dataset`
(its part for the forms with a manifest), so a form works the same everywhere:

- a dataset folder or URL prefix holding ``manifest.json`` (or, for ``index``, any folder of
  ``.tar``/``.tar.gz``/``.tgz`` shards: its files are listed, sorted);
- a manifest file (``DATASET/manifest.json``, or a version's ``manifest.v000002.json``);
- a shard URL, brace pattern or glob, ``"s3://b/train-{000000..001023}.tar"``,
  ``"ds/*.tar"`` (a glob is expanded by its filesystem, sorted, keeping shard files);
- a ``.txt`` file of shard URLs, one a line (blank lines and ``#`` comments skipped; a
  relative entry is relative to the list's folder);
- a Python list of shard URLs.

Any fsspec URL works (local paths, ``s3://``, ``memory://``); the shards of one source must be
on one filesystem. Local shards that a pattern or list names are checked when the source is
resolved (one listing per folder), so a missing one is refused before any epoch; a missing
remote shard is named when a reader first opens it (checking a million objects would cost a
request each).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from shardstream.catalog.facts import DatasetFacts
from shardstream.catalog.shardsizes import refuse_other_shards
from shardstream.catalog.shardspec import ShardSource, ShardSpec
from shardstream.catalog.shardurls import (
    SHARD_URL_SUFFIXES,
    expand_pattern,
    read_url_list,
    refuse_missing,
)
from shardstream.catalog.versions import published_version, read_version
from shardstream.catalog.viewrecords import check_view_files
from shardstream.errors import ConfigError
from shardstream.format.manifest import MANIFEST_NAME, Manifest, read_manifest, read_manifest_file
from shardstream.format.roots import root_store, view_selection
from shardstream.format.shardtable import NameColumn, ShardTable
from shardstream.storage import ReadOptions, StorageOptions, Store
from shardstream.storage.patterns import has_glob

__all__ = [
    "SHARD_SUFFIXES",
    "ShardList",
    "ShardSource",
    "ShardSpec",
    "Source",
    "newest_version",
    "read_dataset",
    "resolve_source",
    "source_of",
]

#: Files a folder's listing takes as shards.
SHARD_SUFFIXES = (".tar", ".tar.gz", ".tgz")
Source = str | os.PathLike[str] | Sequence[str | os.PathLike[str]]


class ShardList:
    """The shards a dataset reads, from one or more sources (a mixture has one per stream).

    Shards are numbered across the sources in order. Counts come from the manifests as arrays
    (nothing per shard is built until a worker opens that shard), so a dataset of a million
    shards costs a few arrays, shared by forked DataLoader workers.
    """

    def __init__(self, sources: Sequence[ShardSource]) -> None:
        self.sources = tuple(sources)
        self.firsts = np.zeros(len(self.sources) + 1, dtype=np.int64)
        np.cumsum([len(source.table) for source in self.sources], out=self.firsts[1:])

    @property
    def counted(self) -> bool:
        """Whether every shard's sample count is known (every source has a manifest)."""
        return all(isinstance(source.table, ShardTable) for source in self.sources)

    def __len__(self) -> int:
        return int(self.firsts[-1])

    def counts(self, source: int | None = None) -> np.ndarray:
        """Samples per shard (of one source, or of all), as an ``int64`` array."""
        tables = [s.table for s in (self.sources if source is None else [self.sources[source]])]
        arrays = [table.num_samples for table in tables if isinstance(table, ShardTable)]
        if len(arrays) != len(tables):
            raise ConfigError("sample counts are unknown: a source has no manifest")
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    def total_samples(self) -> int:
        """Samples over all shards, from the tables' totals (no pass over their counts)."""
        tables = [source.table for source in self.sources]
        if not all(isinstance(table, ShardTable) for table in tables):
            raise ConfigError("sample counts are unknown: a source has no manifest")
        return sum(table.total_samples for table in tables if isinstance(table, ShardTable))

    def facts(self) -> DatasetFacts:
        """What the default epoch order depends on (indexes, local storage, sample size)."""
        tables = [source.table for source in self.sources]
        counted = [table for table in tables if isinstance(table, ShardTable)]
        indexed = len(counted) == len(tables) and all(
            table.num_indexed == len(table) for table in counted
        )
        samples = sum(table.total_samples for table in counted)
        num_bytes = sum(table.total_bytes for table in counted)
        remote = [source for source in self.sources if not source.shards.is_local]
        local = not remote or _fits_caches(remote)
        shards = sum(len(table) for table in counted)
        return DatasetFacts(indexed, local, num_bytes / samples if samples else 0.0,
                            num_bytes / shards if shards else 0.0)  # fmt: skip

    def names(self, source: int = 0) -> list[str]:
        """The shard names of one source, in order (relative to its ``shards`` store)."""
        table = self.sources[source].table
        return list(table if isinstance(table, NameColumn) else table.names)

    def locate(self, shard: int) -> tuple[int, int]:
        """``(source, shard number within it)`` of shard number ``shard``."""
        source = int(np.searchsorted(self.firsts, shard, side="right")) - 1
        return source, shard - int(self.firsts[source])

    def spec(self, shard: int) -> ShardSpec:
        """Shard number ``shard``: its name, source, and what its manifest says."""
        source, local = self.locate(shard)
        table = self.sources[source].table
        if isinstance(table, NameColumn):
            return ShardSpec(table[local], store_index=source)
        info = table[local]
        exclusions = self.sources[source].exclusions
        excluded = exclusions.count(local) if exclusions is not None else 0
        return ShardSpec(info.name, info.num_samples, info.index, info.num_bytes, source, excluded)


def source_of(store: Store, manifest: Manifest) -> ShardSource:
    """The shard source a dataset's manifest describes (its roots, view and exclusions).

    Raises:
        ManifestError: A view whose files went with its pruned source version.
    """
    check_view_files(store, manifest)
    selection = view_selection(store, manifest)
    shards = root_store(store, manifest.shard_root)
    refuse_other_shards(store, shards, manifest)
    indexes = root_store(store, manifest.index_root)
    columns = manifest.columns
    found = None if columns is None else (root_store(store, columns.root), columns)
    return ShardSource(shards, indexes, manifest.shards, selection, manifest.exclusions, found)


def resolve_source(
    source: Source,
    storage_options: StorageOptions = None,
    read_options: ReadOptions | None = None,
    version: int | None = None,
    *,
    list_folder: bool = False,
) -> tuple[Store, ShardList, Manifest | None]:
    """Expand any source into a store and its shards, reading a dataset's manifest.

    Args:
        source: A dataset folder or URL prefix holding ``manifest.json``; a manifest file; a
            shard URL, brace pattern or glob such as ``"s3://b/train-{000000..001023}.tar"``
            or ``"ds/*.tar"``; a ``.txt`` file of shard URLs, one a line (relative ones
            relative to its folder); or a list of shard URLs.
        storage_options: fsspec options (credentials, endpoint) for remote URLs.
        read_options: Retries, read-ahead and cache for reading the shards.
        version: The dataset version to read (None: the newest); for datasets with a manifest.
        list_folder: Take a folder's ``.tar``, ``.tar.gz`` and ``.tgz`` files, sorted by name,
            whether it holds a manifest or not (what ``index`` reads), instead of its manifest.

    Returns:
        The dataset's store, the shards, and the manifest (None for patterns, URL lists and
        listed folders: counts are unknown).

    Raises:
        ManifestNotFoundError: A folder without ``manifest.json``, or without ``version``.
        ConfigError: The source names no shards (a glob that matches none), or shards on
            different storage.
        ShardNotFoundError: A local shard that the pattern or list names does not exist.

    Examples:
        >>> store, shards, _ = resolve_source("d/train-{0..1}.tar")
        >>> store.root, shards.names()
        ('d', ['train-0.tar', 'train-1.tar'])
    """
    if isinstance(source, (str, os.PathLike)):
        text = os.fspath(source)
        if "{" in text or text.endswith(SHARD_URL_SUFFIXES) or has_glob(text):
            urls = expand_pattern(text, storage_options)
        elif text.endswith(".txt"):
            urls = read_url_list(text, storage_options)
        elif list_folder and not text.endswith(".json"):
            return _list_folder(Store(text, storage_options, read_options))
        else:
            store, manifest = read_dataset(text, storage_options, read_options, version)
            if not len(manifest.shards):
                raise ConfigError(f"{store.shown()}: the manifest lists no shards")
            return store, ShardList([source_of(store, manifest)]), manifest
    else:
        urls = [os.fspath(url) for url in source]
    if version is not None:
        raise ConfigError(f"{source!r}: version={version} needs a dataset folder with a manifest")
    if not urls:
        raise ConfigError(f"{source!r} names no shards; pass a folder, a pattern or a URL list")
    refuse_missing(urls, source)
    store, names = Store.for_urls(urls, storage_options, read_options)
    return store, ShardList([ShardSource(store, store, NameColumn.of(names))]), None


def _split_file(text: str) -> tuple[str, str]:
    """``(folder, name)`` of a file's path or URL."""
    folder, _, name = text.rpartition("/")
    return folder or ".", name


def read_dataset(
    source: Source,
    storage_options: StorageOptions = None,
    read_options: ReadOptions | None = None,
    version: int | None = None,
) -> tuple[Store, Manifest]:
    """A dataset's folder and manifest, from the folder (or URL prefix) or a manifest file.

    What :func:`resolve_source` reads for those two forms; views, ``inspect`` and ``verify``,
    which need a manifest, read sources with it.

    Raises:
        ManifestNotFoundError: A folder without ``manifest.json``, or without ``version``.
        ConfigError: The source names shards (a pattern, a URL list, a ``.txt`` file), not a
            dataset with a manifest.

    Examples:
        >>> store, manifest = read_dataset("shards/train/manifest.json")  # doctest: +SKIP
    """
    if not isinstance(source, (str, os.PathLike)):
        raise _no_manifest(f"a list of {len(source)} shard URLs")
    text = os.fspath(source)
    if "{" in text or text.endswith((*SHARD_URL_SUFFIXES, ".txt")):
        raise _no_manifest(text)
    folder, name = _split_file(text) if text.endswith(".json") else (text, MANIFEST_NAME)
    store = Store(folder, storage_options, read_options)
    if name == MANIFEST_NAME:
        return store, read_manifest(store) if version is None else read_version(store, version)
    if version is not None:
        raise ConfigError(
            f"{store.shown(name)}: version={version} needs the dataset folder or its "
            f"{MANIFEST_NAME}, not another manifest file"
        )
    return store, read_manifest_file(store, name)


def newest_version(source: Source, storage_options: StorageOptions = None) -> int | None:
    """The version a read of ``source`` would open now, reading ``manifest.json`` only.

    None for sources without versions: patterns, URL lists, and manifest files other than
    ``manifest.json`` (a version's own file always names that version).

    Examples:
        >>> newest_version("shards/crawl")  # doctest: +SKIP
        3
    """
    if not isinstance(source, (str, os.PathLike)):
        return None
    text = os.fspath(source)
    if "{" in text or text.endswith((*SHARD_URL_SUFFIXES, ".txt")) or has_glob(text):
        return None
    folder, name = _split_file(text) if text.endswith(".json") else (text, MANIFEST_NAME)
    return published_version(Store(folder, storage_options)) if name == MANIFEST_NAME else None


def _no_manifest(shown: str) -> ConfigError:
    return ConfigError(
        f"{shown}: names shards without a manifest, not a dataset; index them first "
        "(`shardstream index SOURCE DEST`, or index_shards) and pass DEST"
    )


def _list_folder(store: Store) -> tuple[Store, ShardList, None]:
    """A folder's shard files, sorted by name (no manifest read: counts unknown)."""
    if store.is_local and not os.path.exists(store.local_path("")):
        raise ConfigError(f"{store.shown()}: does not exist; check the path")
    names = sorted(name for name in store.list_names() if name.endswith(SHARD_SUFFIXES))
    if not names:
        raise ConfigError(f"{store.shown()}: holds no .tar, .tar.gz or .tgz shards")
    return store, ShardList([ShardSource(store, store, NameColumn.of(names))]), None


def _fits_caches(remote: Sequence[ShardSource]) -> bool:
    """Whether every remote source keeps whole shards in a local cache (``cache_dir``) whose
    ``cache_max_bytes`` holds all of their shards: read from there, a piece costs no request.
    A cache without a limit is not taken to hold anything (the disk may be smaller than the
    dataset), and every rank must decide alike, so free disk space is not asked."""
    options = [source.shards.read_options for source in remote]
    if not all(option.cache_dir and option.cache_max_bytes is not None for option in options):
        return False
    total = 0
    for source in remote:
        if not isinstance(source.table, ShardTable) or not source.table.total_bytes:
            return False  # sizes unknown: they may not fit
        total += source.table.total_bytes
    return total <= min(option.cache_max_bytes or 0 for option in options)
