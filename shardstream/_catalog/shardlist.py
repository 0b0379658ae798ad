"""One dataset's shards as readers see them: a shard to read, and where a source's shards are.

:class:`ShardSpec` is one shard as a worker opens it; :class:`ShardSource` is one dataset (one
stream of a mixture): its stores, its shard table, and which stored samples it reads (a view's
selection, a version's exclusions). :mod:`shardstream._catalog.shardlist` numbers the shards of
one or more sources.

Shard URLs from what a user wrote: brace patterns and globs expanded, ``.txt`` lists read
(relative entries relative to the list's folder), local shards that are not there refused.

:func:`~shardstream._catalog.shardlist.resolve_source` calls these, so a pattern or list that
names no shard, or a local shard that is missing, is refused when the dataset is made, with the
pattern and examples named, rather than in a DataLoader worker mid-epoch.

What the default epoch order depends on, known to every rank from the manifest.

Plain data (no I/O, no imports of storage), so the torch-free, I/O-free order formulas in
:mod:`shardstream.streaming._planning.order` take it as it is, and
:meth:`~shardstream._catalog.shardlist.ShardList.facts` fills it in from the shard list.

Shard files against their manifest's sizes: the check a dataset makes when it is opened (a
manifest that describes other files, one copied from another dataset, is refused before any
worker reads a shard), and the shards cut since, which the loader names when a worker died.

Sources -> shard lists: the one function every entry point turns a source into shards with.

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
request each)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import braceexpand
import numpy as np

from shardstream._catalog.versions import check_view_files, published_version, read_version
from shardstream._format.columns import ColumnSet
from shardstream._format.exclusions import Exclusions, Selection
from shardstream._format.manifest import (
    MANIFEST_NAME,
    Manifest,
    read_manifest,
    read_manifest_file,
    root_store,
    view_selection,
)
from shardstream._format.shardtable import NameColumn, ShardTable
from shardstream._storage import ReadOptions, StorageOptions, Store, is_local_url
from shardstream._storage.store import expand_glob, has_glob, missing_local_files, resolve_entry
from shardstream.errors import ConfigError, ManifestError, ShardNotFoundError

__all__ = [
    "DatasetFacts",
    "SHARD_SUFFIXES",
    "SHARD_URL_SUFFIXES",
    "ShardList",
    "ShardSource",
    "ShardSpec",
    "Source",
    "cut_shards",
    "expand_pattern",
    "newest_version",
    "read_dataset",
    "read_url_list",
    "refuse_missing",
    "refuse_other_shards",
    "resolve_source",
    "source_of",
]


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


@dataclasses.dataclass(frozen=True)
class DatasetFacts:
    """What the default order depends on, known to every rank from the manifest.

    Attributes:
        indexed: Every shard has a per-sample byte index (pieces can start anywhere).
        local: Every shard is on a local file system, or kept whole in a local cache that
            holds all of the remote ones (``ReadOptions(cache_dir=...)``): no request per read.
        mean_sample_bytes: Average bytes per sample (shard bytes / samples), 0 if unknown.
        mean_shard_bytes: Average bytes per shard, 0 if unknown.
    """

    indexed: bool
    local: bool
    mean_sample_bytes: float
    mean_shard_bytes: float = 0.0


def refuse_other_shards(dataset: Store, shards: Store, manifest: Manifest) -> None:
    """Refuse a manifest whose shards are all other files than it describes (one copied from
    another dataset): the first, middle and last local shards' sizes, one stat each. One
    truncated shard among them is left to the reader (``on_error="skip"`` reads the rest)."""
    table = manifest.shards
    if not shards.is_local or len(table) < 2:
        return
    numbers = sorted({0, len(table) // 2, len(table) - 1})
    found, missing = [], 0
    for number in numbers:
        info = table[number]
        try:
            size = shards.size(info.name)
        except OSError:
            missing += 1  # alone, the reader names it (or skips it); with others, a sign
            continue
        if size == info.num_bytes:
            return
        found.append((info.name, info.num_bytes, size))
    if not found:
        return
    name, expected, size = found[0]
    gone = f" and {missing} missing" if missing else ""
    raise ManifestError(
        f"{dataset.shown(MANIFEST_NAME)}: describes other shards than these: {len(found)} of "
        f"{len(numbers)} checked differ in size{gone}, such as {shards.shown(name)} ({size} "
        f"bytes, the manifest says {expected}); was it copied from another dataset? Restore its "
        "own manifest, or index the shards again (`shardstream index DEST --overwrite`)"
    )


def cut_shards(
    sources: Sequence[ShardSource], max_found: int = 3, max_checked: int = 100_000
) -> list[str]:
    """Local shards now shorter than their manifests say (at most ``max_found``), as shown in
    messages: one ``stat`` per shard, of at most ``max_checked`` shards. For after a reader
    died of a bus error (SIGBUS), which a memory-mapped file cut while it is read causes.

    Examples:
        >>> cut_shards([])
        []
    """
    found: list[str] = []
    checked = 0
    for source in sources:
        table = source.table
        if not source.shards.is_local or not isinstance(table, ShardTable):
            continue
        for name, expected in zip(table.names, table.num_bytes.tolist(), strict=True):
            checked += 1
            if checked > max_checked or len(found) >= max_found:
                return found
            with contextlib.suppress(OSError):  # a missing shard: the reader names it
                if os.stat(source.shards.local_path(name)).st_size < expected:
                    found.append(source.shards.shown(name))
    return found


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
