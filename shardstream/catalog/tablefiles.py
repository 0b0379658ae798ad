"""Tables of fields read for ``attach``: Parquet, CSV and JSONL files, with types decided
explicitly.

A column's type is what the file declares (Parquet), what ``types`` declares, or what every row
agrees on: a CSV column that is numbers in most rows and text in a few is refused, naming the
field and the row, rather than silently becoming text (a later ``--where 'score > 1'`` would
then compare text with a number). Whatever pyarrow cannot read ends in one message naming the
file and, where it can be found, the line.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from shardstream.errors import ConfigError
from shardstream.format.columns import import_arrow

__all__ = ["cast_declared", "declared_types", "from_pandas", "read_table_file"]

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


def read_table_file(path: str, declared: Mapping[str, Any]) -> Any:
    """A ``.parquet``, ``.csv`` or ``.jsonl`` file as an Arrow table of the declared types."""
    arrow = import_arrow()
    errors = (arrow.ArrowInvalid, arrow.ArrowTypeError, arrow.ArrowNotImplementedError, OSError)
    try:
        if path.endswith(".parquet"):
            return cast_declared(arrow.parquet.read_table(path), declared, path)
        if path.endswith(".csv"):
            return _read_csv(path, declared)
        if path.endswith((".jsonl", ".json")):
            return _read_jsonl(path, declared)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such table file") from None
    except errors as error:
        raise ConfigError(f"{path}: {_reason(path, str(error), declared)}") from None
    raise ConfigError(f"{path}: a table is a .parquet, .csv or .jsonl file")


def cast_declared(table: Any, declared: Mapping[str, Any], where: str) -> Any:
    """``table`` with the declared columns cast to their types (a value that does not fit is
    refused, naming the field)."""
    arrow = import_arrow()
    for field, kind in declared.items():
        if field not in table.column_names:
            raise ConfigError(f"{where}: --type names {field!r}, which is not a column")
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


def _read_csv(path: str, declared: Mapping[str, Any]) -> Any:
    import pyarrow.csv

    table = pyarrow.csv.read_csv(
        path, convert_options=pyarrow.csv.ConvertOptions(column_types=dict(declared))
    )
    for field in table.column_names:
        if field not in declared:
            _refuse_mixed(path, table, field)
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
        f"type is unclear; fix that row, or declare the column's type (--type {field}=float64, "
        f"or --type {field}=string to keep it as text)"
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
        return (f"field {field!r} is a {changed.group(2)} in one row and a {changed.group(3)} "
                f"at {_at(line)}; give the field one type in every row (or declare its type: "
                f"--type {field}=string)")  # fmt: skip
    if path.endswith(".parquet"):
        return f"not a readable Parquet file ({text}); write it again"
    return f"cannot be read ({text}); fix the file"


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
