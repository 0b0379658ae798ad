"""Attaching fields to samples by key, as a new version, without touching a shard.

:func:`attach_columns` takes a table (Parquet, CSV or JSONL file, a pandas DataFrame or a
pyarrow Table) with a key column and other fields, finds each key's samples through the
shards' indexes, and writes one Parquet file per shard aligned with its stored samples
(:mod:`shardstream.format.columns`), then publishes the next version naming them. Fields
attached before are kept (a field attached again takes the new values). Readers then give
every sample its fields like members; ``make_view(..., where=...)`` keeps the samples whose
fields satisfy a predicate.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shardstream._version import __version__
from shardstream.catalog.tablefiles import (
    cast_declared,
    declared_types,
    from_pandas,
    read_table_file,
)
from shardstream.catalog.versions import publish_version
from shardstream.errors import ConfigError, DatasetExistsError
from shardstream.format.columns import (
    ColumnSet,
    column_file,
    columns_folder,
    import_arrow,
    read_column_table,
    write_columns,
)
from shardstream.format.keys import key_hash
from shardstream.format.manifest import Manifest, read_manifest
from shardstream.format.roots import root_store
from shardstream.format.samples import iter_samples
from shardstream.format.shardindex import index_key_hashes
from shardstream.format.tarreader import open_tar
from shardstream.storage import StorageOptions, Store
from shardstream.storage.lock import destination_lock
from shardstream.storage.remote.batchread import read_ranges

__all__ = ["attach_columns", "read_table"]

logger = logging.getLogger(__name__)

_BATCH = 256  # indexes read at once
_UNFINISHED = ("_shardstream_build/plan.json", "_shardstream_index/plan.json")


def attach_columns(
    dataset: str | os.PathLike[str],
    table: Any,
    key: str = "__key__",
    *,
    types: Mapping[str, str] | None = None,
    storage_options: StorageOptions = None,
    progress: Callable[[int, int], None] | None = None,
) -> Manifest:
    """Publish the next version of ``dataset`` with ``table``'s fields attached to its samples.

    Args:
        dataset: The dataset folder or URL (not a view).
        table: A ``.parquet``, ``.csv`` or ``.jsonl`` file, a pandas DataFrame or a pyarrow
            Table: one row per key, with the key column and the fields to attach.
        key: The table's column of sample keys (every sample with that key gets the row).
        types: Declared column types, field -> Arrow type name (``{"score": "float64"}``);
            an undeclared CSV column that mixes numbers and text is refused.
        storage_options: fsspec options for a URL.
        progress: Called as ``progress(shards_done, shards)``.

    Returns:
        The new version's manifest (the published one when the same table was attached last).

    Raises:
        ConfigError: No key column, a key twice, a field named like a member or ``__...``, a
            view, pyarrow missing, or a table that does not read or mixes types in a column
            (the message names the file, the field and the row).
        DatasetExistsError: A build, append or index into it is unfinished or running.

    Examples:
        >>> attach_columns("shards/train", "scores.parquet", key="__key__")  # doctest: +SKIP
    """
    arrow = import_arrow()
    rows = read_table(table, types)
    request = hashlib.sha256(_ipc_bytes(arrow, rows) + key.encode()).hexdigest()
    store = Store(os.fspath(dataset), storage_options)
    with destination_lock(store, "attach"):
        base = _base(store)
        if base.settings.get("attach", {}).get("request") == request:
            logger.warning("%s: version %d already holds this table", store.shown(), base.version)
            return base
        fields = _check_fields(store, base, rows, key)
        version = base.version + 1
        folder = columns_folder(version)
        matched = _write_files(store, base, rows, key, fields, folder, progress)
        types = {name: str(rows.schema.field(name).type) for name in fields}
        if base.columns is not None:  # fields attached before stay, after the new ones
            types = {**types, **{k: v for k, v in base.columns.fields.items() if k not in types}}
        columns = ColumnSet(folder, types, len(base.shards))
        table_name = os.fspath(table) if isinstance(table, (str, os.PathLike)) else None
        settings = {**base.settings, "attach": {"request": request, "fields": list(fields),
                                               "matched_samples": matched,
                                               "table": table_name}}  # fmt: skip
        manifest = Manifest(
            shards=base.shards, class_names=base.class_names, settings=settings,
            skipped=base.skipped, created_by=f"shardstream {__version__} attach",
            shard_root=base.shard_root, index_root=base.index_root, version=version,
            exclusions=base.exclusions, columns=columns,
        )  # fmt: skip
        publish_version(store, manifest)
    return manifest


def read_table(table: Any, types: Mapping[str, str] | None = None) -> Any:
    """``table`` as a pyarrow Table (a path: Parquet, CSV or JSONL by its suffix).

    Column types are decided explicitly: ``types`` (field -> Arrow type name such as
    ``"float64"`` or ``"string"``) declares them; an undeclared CSV column that is numbers in
    most rows and text in a few is refused, naming the field and the row, never turned into
    text (see :mod:`shardstream.catalog.tablefiles`).

    Raises:
        ConfigError: The file does not read (a row with an extra column, a field that is a
            number in one row and text in another, a corrupt Parquet file), a value does not
            fit its declared type, or a CSV column mixes numbers and text.
    """
    arrow = import_arrow()
    declared = declared_types(types or {})
    if isinstance(table, (str, os.PathLike)):
        return read_table_file(os.fspath(table), declared)
    if isinstance(table, arrow.Table):
        return cast_declared(table, declared, "the table")
    if hasattr(table, "to_dict") and hasattr(table, "columns"):  # a pandas DataFrame
        return cast_declared(from_pandas(table), declared, "the DataFrame")
    raise ConfigError(f"a table is a file, a pandas DataFrame or a pyarrow Table, not {table!r}")


def _ipc_bytes(arrow: Any, table: Any) -> bytes:
    sink = arrow.BufferOutputStream()
    with arrow.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return bytes(sink.getvalue())


def _base(store: Store) -> Manifest:
    for name in _UNFINISHED:
        if store.exists(name):
            raise DatasetExistsError(
                f"{store.shown()}: a build, append or index into it is unfinished ({name}); "
                "finish it (or `shardstream abandon` an append), then attach"
            )
    base = read_manifest(store)
    if base.view is not None:
        raise ConfigError(f"{store.shown()}: is a view; attach to its source dataset")
    return base


def _check_fields(store: Store, base: Manifest, rows: Any, key: str) -> list[str]:
    """The fields to attach: every column but the key, none named like a member."""
    if key not in rows.column_names:
        raise ConfigError(f"the table has no key column {key!r} (columns: {rows.column_names})")
    fields = [name for name in rows.column_names if name != key]
    members = _members(store, base)
    for name in fields:
        if name.startswith("__") or name in members or name in ("image", "label"):
            raise ConfigError(
                f"the table's column {name!r} is named like a sample's member or a reserved "
                f"name (members: {sorted(members)}); rename it"
            )
    if not fields:
        raise ConfigError(f"the table has no column besides its key column {key!r}")
    return fields


def _members(store: Store, base: Manifest) -> set[str]:
    shards = root_store(store, base.shard_root)
    name = base.shards[0].name
    with shards.open_read(name) as stream:
        sample, _ = next(iter_samples(open_tar(stream, shards.shown(name)), want_data=False))
    return {extension for extension in sample if not extension.startswith("__")}


def _write_files(
    store: Store, base: Manifest, rows: Any, key: str, fields: list[str], folder: str,
    progress: Callable[[int, int], None] | None,
) -> int:  # fmt: skip
    """Write every shard's file; return how many stored samples got a row."""
    arrow = import_arrow()
    keys = rows.column(key).to_pylist()
    hashes = np.fromiter((key_hash(str(k)) for k in keys), np.int64, len(keys))
    order = np.argsort(hashes, kind="stable")
    ordered = hashes[order]
    if len(ordered) > 1 and np.any(ordered[1:] == ordered[:-1]):
        twice = keys[int(order[int(np.flatnonzero(ordered[1:] == ordered[:-1])[0])])]
        raise ConfigError(f"the table names key {twice!r} twice; one row per key")
    values, used = rows.select(fields), np.zeros(len(keys), dtype=bool)
    indexes = root_store(store, base.index_root)
    matched, total = 0, len(base.shards)
    for first in range(0, total, _BATCH):
        numbers = range(first, min(first + _BATCH, total))
        infos = [base.shards[number] for number in numbers]
        found = read_ranges(indexes, [(info.index or "", None) for info in infos])
        for number, info, data in zip(numbers, infos, found, strict=True):
            if isinstance(data, OSError):
                raise data
            stored = index_key_hashes(data, indexes.shown(info.index or ""))
            if stored is None:
                raise ConfigError(f"{info.name}: its index has no key hashes; re-index it")
            where = np.searchsorted(ordered, stored).clip(max=max(0, len(ordered) - 1))
            hit = ordered[where] == stored if len(ordered) else np.zeros(len(stored), bool)
            rows_taken = np.where(hit, order[where], 0)
            used[rows_taken[hit]] = True
            matched += int(hit.sum())
            taken = arrow.array(rows_taken, mask=~hit, type=arrow.int64())
            table = _merged(store, base, number, values.take(taken))
            write_columns(store, column_file(folder, info.name), table)
        if progress is not None:
            progress(numbers.stop, total)
    if not used.all():
        logger.warning(
            "%s: %d of the table's %d keys are in no shard; their rows are not attached",
            store.shown(), int((~used).sum()), len(keys),
        )  # fmt: skip
    return matched


def _merged(store: Store, base: Manifest, number: int, new: Any) -> Any:
    """A shard's new fields, then the fields attached before that the table does not replace."""
    columns = base.columns
    if columns is None or number >= columns.num_shards:
        return new
    old = read_column_table(store, column_file(columns.folder, base.shards.names[number]))
    for name in old.column_names:
        if name not in new.column_names:
            new = new.append_column(old.field(name), old.column(name))
    return new
