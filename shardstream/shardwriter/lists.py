"""CSV and JSONL list sources: ``path,label[,more fields]`` rows, one sample per row.

Relative paths are resolved against the list file's folder. The key is an explicit ``key``
field when there is one, else the path without its extension. Labels are integers, or class
names (then sorted names give the labels). Every other field goes into the sample's ``json``
member.
"""

from __future__ import annotations

import csv
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardstream.errors import SourceError
from shardstream.format import codecs
from shardstream.format.keys import check_key
from shardstream.format.manifest import SkippedSample
from shardstream.shardwriter.records import FileTable, FileTableBuilder, ScanProgress

__all__ = ["read_list"]

logger = logging.getLogger(__name__)


def read_list(
    list_path: str, kind: str, on_error: str = "raise", progress: ScanProgress | None = None
) -> tuple[FileTable, tuple[str, ...] | None, tuple[SkippedSample, ...]]:
    """Read a CSV or JSONL list into a table, its class names and the rows skipped
    (``progress``: called every few hundred rows with the files and bytes found)."""
    root = os.path.dirname(os.path.abspath(list_path))
    rows = _csv_rows(list_path) if kind == "csv" else _jsonl_rows(list_path)
    builder = FileTableBuilder(root, with_keys=True, with_extras=True, progress=progress)
    names: dict[str, int] = {}
    skipped: list[SkippedSample] = []
    for where, row in rows:
        try:
            _add_row(builder, root, where, row, names)
        except SourceError as error:
            if on_error != "skip":
                raise
            skipped.append(SkippedSample(where, str(error)))
            logger.warning("skipped %s", error)
    if len(builder) == 0:
        raise SourceError(f"{list_path}: the list has no usable rows (expected path,label,...)")
    table = builder.build()
    if not names:
        return table, None, tuple(skipped)
    return _remap_class_names(table, names), tuple(sorted(names)), tuple(skipped)


def _add_row(
    builder: FileTableBuilder, root: str, where: str, row: dict[str, Any], names: dict[str, int]
) -> None:
    path = str(row.pop("path", "") or "")
    if not path:
        raise SourceError(f"{where}: no 'path' field")
    key = str(row.pop("key", "") or _key_from_path(path))
    check_key(key, where)
    extension = path.rpartition(".")[2].lower()
    if extension not in codecs.IMAGE_EXTENSIONS:
        raise SourceError(f"{where}: {path!r} is not an image file (by its extension)")
    label = _label(row.pop("label", None), names, where)
    try:
        size = os.stat(os.path.join(root, path)).st_size
    except OSError as error:
        raise SourceError(f"{where}: cannot read {path!r}: {error.strerror or error}") from error
    extra = json.dumps(row, sort_keys=True, separators=(",", ":")).encode() if row else b""
    builder.add(path, label, size, key=key, extra=extra)


def _key_from_path(path: str) -> str:
    normalized = path.replace("\\", "/").lstrip("/")
    while normalized.startswith("./"):
        normalized = normalized[2:]
    folder, _, name = normalized.rpartition("/")
    stem = name.rpartition(".")[0] or name
    return f"{folder}/{stem}" if folder else stem


def _label(value: Any, names: dict[str, int], where: str) -> int:
    """Integer labels pass through; class names get provisional ids (remapped once sorted)."""
    if value is None or value == "":
        return -1
    if isinstance(value, int) and not isinstance(value, bool):
        integer = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        integer = int(value)
    else:
        if not isinstance(value, str):
            raise SourceError(f"{where}: label {value!r} is neither an integer nor a class name")
        return -2 - names.setdefault(value, len(names))
    if names:
        raise SourceError(f"{where}: integer label {value!r} mixed with class-name labels")
    if integer < 0:
        raise SourceError(f"{where}: negative label {integer}")
    return integer


def _remap_class_names(table: FileTable, names: dict[str, int]) -> FileTable:
    if int(table.labels.max()) >= 0:
        raise SourceError(f"{table.root}: the list mixes integer labels and class-name labels")
    order = sorted(names)
    provisional_to_sorted = np.empty(len(names), dtype=np.int32)
    for sorted_index, name in enumerate(order):
        provisional_to_sorted[names[name]] = sorted_index
    labels = table.labels.copy()
    named = labels <= -2
    labels[named] = provisional_to_sorted[-2 - labels[named]]
    return FileTable(
        table.root, table.paths, table.offsets, labels, table.sizes, table.keys, table.extras
    )


def _csv_rows(list_path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with open(list_path, newline="", encoding="utf-8") as stream:
        reader = csv.reader(stream)
        header: list[str] | None = None
        for line_number, cells in enumerate(reader, start=1):
            if not cells or all(not cell.strip() for cell in cells):
                continue
            if header is None:
                if cells[0].strip().lower() == "path":
                    header = [cell.strip() for cell in cells]
                    continue
                header = ["path", "label"] + [f"field_{i}" for i in range(2, len(cells))]
            if len(cells) != len(header):
                raise SourceError(
                    f"{list_path}:{line_number}: expected {len(header)} fields "
                    f"({','.join(header)}), found {len(cells)}"
                )
            yield f"{list_path}:{line_number}", dict(zip(header, cells, strict=False))


def _jsonl_rows(list_path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with open(list_path, encoding="utf-8") as stream:
        for line_number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            where = f"{list_path}:{line_number}"
            try:
                row = json.loads(line)
            except ValueError as error:
                raise SourceError(f"{where}: not valid JSON ({error})") from error
            if not isinstance(row, dict):
                raise SourceError(f"{where}: expected a JSON object with a 'path' field")
            yield where, row
