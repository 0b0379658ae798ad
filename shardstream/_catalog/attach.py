"""Tables of fields read for ``attach``: Parquet, CSV and JSONL files, with types decided
explicitly.

A column's type is what the file declares (Parquet), what ``types`` declares, or what every row
agrees on: a CSV column that is numbers in most rows and text in a few is refused, naming the
field and the row, rather than silently becoming text (a later ``--where 'score > 1'`` would
then compare text with a number). Whatever pyarrow cannot read ends in one message naming the
file and, where it can be found, the line.

Attaching fields to samples by key, as a new version, without touching a shard.

:func:`attach_columns` takes a table (Parquet, CSV or JSONL file, a pandas DataFrame or a
pyarrow Table) with a key column and other fields, finds each key's samples through the
shards' indexes, and writes one Parquet file per shard aligned with its stored samples
(:mod:`shardstream._format.columns`), then publishes the next version naming them. Fields
attached before are kept (a field attached again takes the new values). Readers then give
every sample its fields like members; ``make_view(..., where=...)`` keeps the samples whose
fields satisfy a predicate."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from shardstream._catalog.versions import publish_version
from shardstream._format.columns import (
    ColumnSet,
    column_file,
    columns_folder,
    import_arrow,
    read_column_table,
    write_columns,
)
from shardstream._format.keys import key_hash
from shardstream._format.manifest import Manifest, read_manifest, root_store
from shardstream._format.shardindex import index_key_hashes
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream._storage import StorageOptions, Store
from shardstream._storage.store import destination_lock, read_ranges
from shardstream._version import __version__
from shardstream.errors import ConfigError, DatasetExistsError

__all__ = [
    "attach_columns",
    "cast_declared",
    "declared_types",
    "from_pandas",
    "read_table",
    "read_table_file",
    "refuse_repeated_columns",
]


_NUMBER = r"^\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*$"


def declared_types(types: Mapping[str, str]) -> dict[str, Any]:
    """Field -> Arrow type, from type names such as ``"float64"``, ``"int64"``, ``"string"``."""
    arrow, declared = import_arrow(), {}
    for field, name in types.items():
        try:
            declared[field] = arrow.type_for_alias(name)
        except ValueError:
            raise ConfigError(
                f"type {name!r} of field {field!r} is not an Arrow type; use e.g. int64, "
                "float64, string, bool"
            ) from None
    return declared


def read_table_file(path: str, declared: Mapping[str, Any], key: str | None = None) -> Any:
    """A ``.parquet``, ``.csv`` or ``.jsonl`` file as an Arrow table of the declared types (a
    CSV's ``key`` column read as text: keys such as ``000123`` are not numbers)."""
    arrow = import_arrow()
    errors = (arrow.ArrowInvalid, arrow.ArrowTypeError, arrow.ArrowNotImplementedError, OSError)
    try:
        if path.endswith(".parquet"):
            return cast_declared(arrow.parquet.read_table(path), declared, path)
        if path.endswith(".csv"):
            as_text = {} if key is None or key in declared else {key: arrow.string()}
            return _read_csv(path, declared, {**declared, **as_text})
        if path.endswith((".jsonl", ".json")):
            return _check_declared(_read_jsonl(path, declared), declared, path)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such table file") from None
    except errors as error:
        raise ConfigError(f"{path}: {_reason(path, str(error), declared)}") from None
    raise ConfigError(f"{path}: a table is a .parquet, .csv or .jsonl file")


def cast_declared(table: Any, declared: Mapping[str, Any], where: str) -> Any:
    """``table`` with the declared columns cast to their types (a value that does not fit is
    refused, naming the field)."""
    arrow = import_arrow()
    _check_declared(table, declared, where)
    for field, kind in declared.items():
        position = table.column_names.index(field)
        try:
            column = table.column(field).cast(kind)
        except (arrow.ArrowInvalid, arrow.ArrowNotImplementedError) as error:
            raise ConfigError(
                f"{where}: column {field!r} does not fit its declared type {kind} ({error})"
            ) from None
        table = table.set_column(position, arrow.field(field, kind), column)
    return table


def from_pandas(frame: Any) -> Any:
    """A pandas DataFrame as an Arrow table; a column of mixed Python types is refused, naming
    the field and the first row whose type differs."""
    arrow = import_arrow()
    try:
        return arrow.Table.from_pandas(frame, preserve_index=False)
    except (arrow.ArrowInvalid, arrow.ArrowTypeError, arrow.ArrowNotImplementedError) as error:
        found = re.search(r"column (.+?) with type", str(error))
        field = found.group(1) if found else None
        if field is None or field not in frame.columns:
            raise ConfigError(f"the DataFrame does not convert to a table: {error}") from None
        values = [value for value in frame[field].tolist() if value is not None]
        first = type(values[0]) if values else object
        row = next((number for number, value in enumerate(frame[field].tolist())
                    if value is not None and not isinstance(value, first)), None)  # fmt: skip
        where = f"; row {row} holds {frame[field].iloc[row]!r}" if row is not None else ""
        raise ConfigError(
            f"the DataFrame's column {field!r} mixes types ({first.__name__} in its first "
            f"rows{where}); give it one type (e.g. df[{field!r}].astype(str))"
        ) from None


def _check_declared(table: Any, declared: Mapping[str, Any], where: str) -> Any:
    """``table``, refused when a declared type names a field that no row holds (a misspelt
    name would otherwise be ignored, or attached as a field of nulls)."""
    for field in declared:
        if field not in table.column_names or table.column(field).null_count == len(table):
            raise ConfigError(
                f"{where}: the declared types name {field!r}, which is not a column (columns: "
                f"{', '.join(name for name in table.column_names if name != field)})"
            )
    return table


def _read_csv(path: str, declared: Mapping[str, Any], column_types: Mapping[str, Any]) -> Any:
    import pyarrow.csv

    table = pyarrow.csv.read_csv(
        path, convert_options=pyarrow.csv.ConvertOptions(column_types=dict(column_types))
    )
    refuse_repeated_columns(table, path)
    _check_declared(table, declared, path)
    for field in table.column_names:
        if field not in column_types:
            _refuse_mixed(path, table, field)
    return table


def refuse_repeated_columns(table: Any, where: str) -> Any:
    """``table``, refused when two of its columns have one name (neither could be chosen)."""
    names = table.column_names
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"{where}: has two columns named {twice[0]!r}; rename one")
    return table


def _refuse_mixed(path: str, table: Any, field: str) -> None:
    """Refuse a text column whose values are numbers in most rows (a stray cell made it text)."""
    arrow = import_arrow()
    column = table.column(field)
    if not arrow.types.is_string(column.type) and not arrow.types.is_large_string(column.type):
        return
    compute = arrow.compute
    given = compute.fill_null(compute.not_equal(compute.utf8_trim_whitespace(column), ""), False)
    numeric = compute.fill_null(compute.match_substring_regex(column, _NUMBER), False)
    num_given, num_numeric = compute.sum(given).as_py() or 0, compute.sum(numeric).as_py() or 0
    if not 2 * num_numeric > num_given or num_numeric == num_given:
        return
    stray = compute.and_(given, compute.invert(numeric)).to_numpy(zero_copy_only=False)
    row = int(stray.nonzero()[0][0])
    raise ConfigError(
        f"{path}: column {field!r} is numbers in {num_numeric} of {num_given} rows but "
        f"{column[row].as_py()!r} at line {row + 2} (row {row + 1} after the header), so its "
        f"type is unclear; fix that row, or declare the column's type: "
        f"types={{{field!r}: 'float64'}} (--type {field}=float64), or "
        f"types={{{field!r}: 'string'}} (--type {field}=string) to keep it as text"
    )


def _read_jsonl(path: str, declared: Mapping[str, Any]) -> Any:
    import pyarrow.json

    arrow = import_arrow()
    schema = arrow.schema(list(declared.items())) if declared else None
    options = pyarrow.json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
    return pyarrow.json.read_json(path, parse_options=options)


def _reason(path: str, text: str, declared: Mapping[str, Any]) -> str:
    """pyarrow's complaint, said with the field and the file's line where they can be found,
    and how to fix it."""
    text = text.strip().splitlines()[0] if text.strip() else "unreadable"
    extra = re.search(r"Expected (\d+) columns, got (\d+): (.*)", text)
    if extra:
        line = _line_of(path, lambda row: row == extra.group(3))
        return (f"{_at(line)} has {extra.group(2)} columns where the header has "
                f"{extra.group(1)} ({extra.group(3)!r}); fix that row")  # fmt: skip
    invalid = re.search(r"column #(\d+): CSV conversion error to (\w+): invalid value '(.*)'", text)
    if invalid:
        field, value = _csv_header(path)[int(invalid.group(1))], invalid.group(3)
        line = _line_of(path, lambda row: value in row.split(","))
        return (
            f"column {field!r} is declared {declared.get(field, invalid.group(2))} but "
            f"{_at(line)} holds {value!r}; fix that row, or declare another type"
        )
    changed = re.search(r"Column\(/([^)]*)\) changed from (\w+) to (\w+)", text)
    if changed:
        field = changed.group(1)
        if field in declared:
            line = _json_line_of(path, field, _json_kind_of(declared[field]))
            return (
                f"field {field!r} is declared {declared[field]} but {_at(line)} holds a "
                "value of another kind; fix that row, or declare another type"
            )
        line = _json_line_of(path, field)
        first, then = (_with_article(kind) for kind in changed.group(2, 3))
        # Not "declare its type": a JSON reader takes a declared type only where every row's
        # value is of one kind (a number may be declared float64, "1" and 1 cannot be one).
        return (f"field {field!r} is {first} in one row and {then} at {_at(line)}; give the "
                f"field values of one kind in every row (a string in each, \"1\" rather than "
                f"1, to keep it as text)")  # fmt: skip
    if path.endswith(".parquet"):
        return f"not a readable Parquet file ({text}); write it again"
    return f"cannot be read ({text}); fix the file"


def _with_article(kind: str) -> str:
    """``an object``, ``a number``: pyarrow's name of a JSON kind, as a phrase."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind}"


def _at(line: int | None) -> str:
    return f"line {line}" if line else "a row"


def _csv_header(path: str) -> list[str]:
    with open(path, encoding="utf-8", errors="replace") as stream:
        return [name.strip() for name in stream.readline().rstrip("\r\n").split(",")]


def _line_of(path: str, wanted: Callable[[str], bool]) -> int | None:
    """The first line after the header that ``wanted`` accepts."""
    with open(path, encoding="utf-8", errors="replace") as stream:
        for number, line in enumerate(stream, 1):
            if number > 1 and wanted(line.rstrip("\r\n")):
                return number
    return None


def _json_kind_of(kind: Any) -> str:
    arrow = import_arrow()
    if arrow.types.is_integer(kind) or arrow.types.is_floating(kind):
        return "number"
    return "bool" if arrow.types.is_boolean(kind) else "str"


def _json_line_of(path: str, field: str, expected: str | None = None) -> int | None:
    """The first line whose ``field`` is of another JSON kind than ``expected`` (or than the
    lines before it)."""
    with open(path, encoding="utf-8", errors="replace") as stream:
        for number, line in enumerate(stream, 1):
            try:
                value = json.loads(line).get(field) if line.strip() else None
            except (ValueError, AttributeError):
                return number
            if value is None:
                continue
            numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
            kind = "number" if numeric else type(value).__name__
            if expected is not None and kind != expected:
                return number
            expected = kind
    return None


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
    rows = read_table(table, types, key)
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
        if matched == 0:
            store.remove_folder(folder)
            raise ConfigError(_no_match(store, base, rows, key))
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


def read_table(table: Any, types: Mapping[str, str] | None = None, key: str | None = None) -> Any:
    """``table`` as a pyarrow Table (a path: Parquet, CSV or JSONL by its suffix).

    Column types are decided explicitly: ``types`` (field -> Arrow type name such as
    ``"float64"`` or ``"string"``) declares them; an undeclared CSV column that is numbers in
    most rows and text in a few is refused, naming the field and the row, never turned into
    text (see :mod:`shardstream._catalog.attach`).

    Raises:
        ConfigError: The file does not read (a row with an extra column, a field that is a
            number in one row and text in another, a corrupt Parquet file), a value does not
            fit its declared type, or a CSV column mixes numbers and text.
    """
    arrow = import_arrow()
    declared = declared_types(types or {})
    if isinstance(table, (str, os.PathLike)):
        path = os.fspath(table)
        return refuse_repeated_columns(read_table_file(path, declared, key), path)
    if isinstance(table, arrow.Table):
        return cast_declared(refuse_repeated_columns(table, "the table"), declared, "the table")
    if hasattr(table, "to_dict") and hasattr(table, "columns"):  # a pandas DataFrame
        rows = refuse_repeated_columns(from_pandas(table), "the DataFrame")
        return cast_declared(rows, declared, "the DataFrame")
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
    if rows.num_rows == 0:
        raise ConfigError("the table has no rows (a header only?); nothing to attach")
    return fields


def _members(store: Store, base: Manifest) -> set[str]:
    return {extension for extension in _first_sample(store, base) if not extension.startswith("__")}


def _first_sample(store: Store, base: Manifest) -> dict[str, Any]:
    """The first shard's first sample, its members without their bytes."""
    shards = root_store(store, base.shard_root)
    name = base.shards[0].name
    with shards.open_read(name) as stream:
        sample, _ = next(iter_samples(open_tar(stream, shards.shown(name)), want_data=False))
    return dict(sample)


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
    if used.any() and not used.all():  # none used: attach_columns refuses the table
        logger.warning(
            "%s: %d of the table's %d keys are in no shard; their rows are not attached",
            store.shown(), int((~used).sum()), len(keys),
        )  # fmt: skip
    return matched


def _no_match(store: Store, base: Manifest, rows: Any, key: str) -> str:
    """Why nothing was attached: none of the table's keys is a sample's (shown side by side)."""
    return (
        f"{store.shown()}: none of the table's {rows.num_rows} keys is a sample's key (its "
        f"column {key!r} holds keys such as {str(rows.column(key)[0].as_py())!r}, the shards "
        f"keys such as {_first_sample(store, base)['__key__']!r}); nothing was attached. Give "
        "the table the samples' keys, or name the column that holds them with "
        "key='COLUMN' (--key COLUMN)"
    )


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
