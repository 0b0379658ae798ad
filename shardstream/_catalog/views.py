"""The manifest of a view: the source's shards, read where the source keeps them, with the
counts the view keeps and what it selected (by keys, splits or a predicate over fields).

Views by a predicate over attached fields: ``make_view(source, dest, where="aesthetic >= 5")``.

The view lists the source version's shards with the counts of the samples whose fields satisfy
the predicate (:class:`~shardstream._format.columns.Predicate`), and leaves the others out with an
exclusion list (:mod:`shardstream._format.exclusions`), so it reads, plans and resumes exactly
like any excluded version; its samples carry the source's fields. Making it reads each shard's
field file once, one shard at a time; the exclusion list it writes holds 12 bytes per sample
left out.

Views: subsets and train/val splits of a dataset, without rewriting a byte of it.

A view is a small manifest in its own folder: the source dataset's shards (where they are),
how many samples of each the view keeps, and the rule that keeps them
(:class:`~shardstream._format.exclusions.Selection`: a seeded fraction of the keys, a range of
that draw for splits, or a list of keys). Everything that reads a dataset reads a view the same
way: exact equal epochs, resume at any world size, mixtures, random access. Choosing costs one
read of every shard's index (the key hashes), not of the shards."""

from __future__ import annotations

import concurrent.futures as cf
import keyword
import logging
import os
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from shardstream._catalog.shardlist import Source, read_dataset
from shardstream._catalog.versions import record_view
from shardstream._format.columns import (
    ColumnSet,
    Predicate,
    column_file,
    import_arrow,
    read_column_table,
)
from shardstream._format.exclusions import Exclusions, Selection
from shardstream._format.keys import key_hash
from shardstream._format.manifest import (
    MANIFEST_NAME,
    Manifest,
    absolute_root,
    read_manifest_file,
    root_store,
    write_manifest,
)
from shardstream._format.shardindex import decode_index
from shardstream._format.shardtable import ShardTable
from shardstream._storage import StorageOptions, Store
from shardstream._version import __version__
from shardstream.errors import ConfigError, DatasetExistsError, ShardstreamError

__all__ = [
    "FILTERED_VERSION",
    "make_view",
    "split_dataset",
    "where_view",
]


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


#: The version an exclusion list gives the samples a view's predicate leaves out.
FILTERED_VERSION = 0


def where_view(
    source: Source,
    dest: str | os.PathLike[str],
    where: str,
    *,
    storage_options: StorageOptions = None,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Write a view of ``source`` into ``dest`` keeping the samples whose fields satisfy ``where``.

    Raises:
        ConfigError: The source is a view or has no attached fields, or the predicate does
            not parse or names a field the source lacks.

    Examples:
        >>> where_view("shards/train", "shards/pretty", "aesthetic >= 5")  # doctest: +SKIP
    """
    origin, manifest = read_dataset(source, storage_options)
    target = view_destination(dest, storage_options)
    if manifest.view is not None or manifest.columns is None:
        Predicate(where)  # a predicate that does not parse is told first
        raise ConfigError(
            f"{origin.shown()}: {'is a view' if manifest.view else 'has no attached fields'}; a "
            "view by fields is made of a dataset with fields (`shardstream attach`)"
        )
    try:
        predicate = Predicate(where)
    except ConfigError as error:
        raise ConfigError(f"{error}{_unnamable(where, manifest.columns.fields)}") from None
    columns, fields = manifest.columns, root_store(origin, manifest.columns.root)
    counts = np.zeros(len(manifest.shards), np.int64)
    left_out, schema = [], None
    for number, info in enumerate(manifest.shards):
        excluded = np.empty(0, np.int64)
        if manifest.exclusions is not None:
            excluded = manifest.exclusions.positions(number)
        keep = np.zeros(info.num_samples + len(excluded), dtype=bool)
        if number < columns.num_shards:
            table = read_column_table(fields, column_file(columns.folder, info.name))
            keep, schema = predicate.mask(table), table.schema
        elif schema is not None:  # appended after the attach: its samples' fields are null
            keep = predicate.mask(_nulls(schema, len(keep)))
        keep[excluded] = False
        counts[number] = int(keep.sum())
        left_out.append((np.int64(number) << np.int64(32)) | np.flatnonzero(~keep))
        if progress is not None:
            progress(number + 1, len(manifest.shards))
    view = _view_manifest(origin, manifest, counts, left_out, where, fields)
    target.makedirs()
    write_manifest(target, view)
    record_view(origin, target, manifest.version)
    return view


def _view_manifest(
    origin: Store, manifest: Manifest, counts: np.ndarray, left_out: list[np.ndarray],
    where: str, fields: Store,
) -> Manifest:  # fmt: skip
    places = np.concatenate(left_out) if left_out else np.empty(0, np.int64)
    versions = np.full(len(places), FILTERED_VERSION, np.uint32)
    if manifest.exclusions is not None:  # the source's own exclusions keep their versions
        where_found = np.searchsorted(manifest.exclusions.places, places)
        found = where_found < len(manifest.exclusions)
        found[found] = manifest.exclusions.places[where_found[found]] == places[found]
        versions[found] = manifest.exclusions.versions[where_found[found]]
    columns: Any = manifest.columns
    kept = ColumnSet(columns.folder, columns.fields, columns.num_shards, absolute_root(fields))
    select = {"kind": "where", "where": where}
    return view_manifest(origin, manifest, counts, select, Exclusions(places, versions), kept)


logger = logging.getLogger(__name__)

KEYS_NAME = "view.keys"
_READERS = 16  # index reads in flight (they wait on storage, not on the CPU)


def view_destination(dest: str | os.PathLike[str], storage_options: StorageOptions) -> Store:
    """Where a view goes: a new or empty folder, or one holding a view (made again).

    Raises:
        DatasetExistsError: ``dest`` holds a dataset's manifest (the view would replace it).
    """
    target = Store(os.fspath(dest), storage_options)
    if not target.exists(MANIFEST_NAME):
        return target
    try:
        found = read_manifest_file(target, MANIFEST_NAME)
    except ShardstreamError:
        found = None
    if found is None or found.view is None:
        held = "" if found is None else f" ({found.num_samples} samples, version {found.version})"
        raise DatasetExistsError(
            f"{target.shown()}: holds a dataset{held}, not a view; its manifest would be "
            "replaced. Write the view to a new folder (a view replaces only a view)"
        )
    return target


def _nulls(schema: Any, num_rows: int) -> Any:
    """A table of ``schema``'s fields, ``num_rows`` rows of nulls (``score is None`` keeps them)."""
    arrow = import_arrow()
    return arrow.table([arrow.nulls(num_rows, field.type) for field in schema], schema=schema)


def _unnamable(where: str, fields: Iterable[str]) -> str:
    """Why a predicate cannot name a field it mentions (``my-score``, ``class``), if it is so."""
    for field in fields:
        if field in where and (not field.isidentifier() or keyword.iskeyword(field)):
            name = re.sub(r"\W+", "_", field).strip("_") or "field"
            if keyword.iskeyword(name):
                name = f"{name}_"
            elif not name.isidentifier():
                name = f"f_{name}"
            return (
                f"; field {field!r} is not a Python name, so a predicate cannot name it: attach "
                f"it again under a name such as {name!r}"
            )
    return ""


def make_view(
    source: Source,
    dest: str | os.PathLike[str],
    *,
    fraction: float | None = None,
    keys: Iterable[str] | None = None,
    bounds: tuple[float, float] | None = None,
    where: str | None = None,
    seed: int = 0,
    storage_options: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Write a view of ``source`` into ``dest``, by ``fraction``, ``keys``, ``bounds`` or ``where``.

    With ``keys``, keys that are in no shard are logged (how many, and a few of them).

    Args:
        source: A dataset folder or URL, or its manifest file, whose shards have indexes with
            key hashes (built by shardstream, or indexed with ``shardstream index``).
        dest: The view's folder (it holds only a manifest, and the key list for ``keys``).
        fraction: Keep about this fraction of the samples, chosen by key with ``seed``.
        keys: Keep the samples with these keys.
        bounds: Keep the keys whose seeded draw lies in ``[low, high)`` (for splits).
        where: Keep the samples whose attached fields satisfy this predicate, e.g.
            ``"aesthetic >= 5"``.
        seed: Seed of the draw: the same seed always keeps the same keys.
        storage_options: fsspec options for remote URLs.
        progress: Called as ``progress(shards_done, shards)`` while the indexes are read.

    Examples:
        >>> view = make_view("shards/train", "shards/train-10pct", fraction=0.1)  # doctest: +SKIP
        >>> view.num_samples  # doctest: +SKIP
        128117
    """
    chosen = [fraction is not None, keys is not None, bounds is not None, where is not None]
    if sum(chosen) != 1:
        raise ConfigError("a view takes exactly one of fraction, keys, bounds or where")
    if where is not None:
        return where_view(source, dest, where, storage_options=storage_options, progress=progress)
    if fraction is not None:
        if not 0 < fraction <= 1:  # 0 would write a view of no samples
            raise ConfigError(
                f"a view's fraction is more than 0 and at most 1 (fraction=0.1 keeps about a "
                f"tenth of the samples), got {fraction}"
            )
        selection = Selection.fraction(fraction, seed)
    elif bounds is not None:
        selection = Selection("range", seed, *bounds)
    else:
        keys = list(dict.fromkeys(keys or ()))
        selection = Selection.of_keys(np.fromiter(map(key_hash, keys), np.int64))
    origin, manifest = read_dataset(source, storage_options)
    if manifest.view is not None:
        raise ConfigError(f"{origin.shown()}: is a view; make views of the source dataset")
    target = view_destination(dest, storage_options)
    counts, found = _kept_counts(origin, manifest, selection, progress)
    if keys is not None:
        _log_unknown_keys(list(keys), found, origin)
    target.makedirs()
    keys_file = None
    if selection.kind == "keys" and selection.keys is not None:
        keys_file = KEYS_NAME
        with target.open_atomic_write(KEYS_NAME) as stream:
            stream.write(selection.keys.astype("<i8").tobytes())
    view = view_manifest(origin, manifest, counts, selection.as_dict(keys_file),
                         manifest.exclusions, _columns_of(origin, manifest))  # fmt: skip
    write_manifest(target, view)
    record_view(origin, target, manifest.version)
    return view


def split_dataset(
    source: Source,
    dest: str | os.PathLike[str],
    splits: Mapping[str, float],
    *,
    seed: int = 0,
    storage_options: Mapping[str, Any] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Manifest]:
    """A view per split in ``dest/<name>``, by key: every key in exactly one split.

    Raises:
        ConfigError: A share is negative, or the shares do not add up to 1.

    Examples:
        >>> shares = {"train": 0.9, "val": 0.1}
        >>> views = split_dataset("shards/all", "shards/split", shares)  # doctest: +SKIP
    """
    total = sum(splits.values())
    if not splits or any(share < 0 for share in splits.values()) or abs(total - 1) > 1e-6:
        raise ConfigError(
            f"split shares must be non-negative and add up to 1, got {dict(splits)} (sum "
            f"{total:g}); e.g. train=0.9,val=0.1"
        )
    for name in splits:  # all refused before any is written
        view_destination(Store(dest, storage_options).url(name), storage_options)
    low, views = 0.0, {}
    for number, (name, share) in enumerate(splits.items()):
        high = 1.0 if number == len(splits) - 1 else low + share / total
        target = Store(dest, storage_options).url(name)
        views[name] = make_view(
            source, target, bounds=(low, high), seed=seed, storage_options=storage_options,
            progress=progress,
        )  # fmt: skip
        low = high
    return views


def _kept_counts(
    origin: Store, manifest: Manifest, selection: Selection,
    progress: Callable[[int, int], None] | None,
) -> tuple[np.ndarray, set[int]]:  # fmt: skip
    """How many samples of each shard the selection keeps, from the shards' key hashes; for a
    selection by keys, also the hashes of the kept keys."""
    indexes = root_store(origin, manifest.index_root)
    total, by_keys = len(manifest.shards), selection.kind == "keys"
    found: set[int] = set()

    def count(number: int) -> int:
        shard = manifest.shards[number]
        if shard.index is None:
            raise ConfigError(
                f"{shard.name}: has no index (a gzipped shard cannot be read by key); a view "
                "needs every shard indexed"
            )
        index = decode_index(indexes.read_bytes(shard.index), indexes.shown(shard.index))
        if index.key_hashes is None:
            raise ConfigError(
                f"{indexes.shown(shard.index)}: has no key hashes (an older build); run "
                "`shardstream index --overwrite` on the dataset first"
            )
        kept = selection.keep(index.key_hashes)
        if manifest.exclusions is not None:  # the version's excluded samples stay out
            kept[manifest.exclusions.positions(number)] = False
        if by_keys:
            found.update(index.key_hashes[kept].tolist())  # the pool's threads share the GIL
        return int(kept.sum())

    counts = np.zeros(total, np.int64)
    with cf.ThreadPoolExecutor(_READERS) as pool:
        for number, kept in enumerate(pool.map(count, range(total))):
            counts[number] = kept
            if progress is not None:
                progress(number + 1, total)
    return counts, found


def _log_unknown_keys(keys: Sequence[str], found: set[int], origin: Store) -> None:
    """Log how many of ``keys`` are in no shard, with a few of them."""
    unknown = [key for key in keys if key_hash(key) not in found]
    if unknown:
        examples = ", ".join(repr(key) for key in unknown[:5])
        logger.warning(
            "%s: %d of the %d keys asked for are in no shard (such as %s); the view leaves "
            "them out", origin.shown(), len(unknown), len(keys), examples,
        )  # fmt: skip


def _columns_of(origin: Store, manifest: Manifest) -> ColumnSet | None:
    """The source's attached fields, found from the view (their folder, absolute)."""
    columns = manifest.columns
    if columns is None:
        return None
    root = absolute_root(root_store(origin, columns.root))
    return ColumnSet(columns.folder, columns.fields, columns.num_shards, root)
