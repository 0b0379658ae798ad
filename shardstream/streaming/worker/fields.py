"""Fields attached by key (``shardstream attach``), added to the samples a worker reads.

A shard's fields are one small Parquet file (:mod:`shardstream.format.columns`), read once
when a worker first reads that shard and kept, as Python values, for the shards it reads at a
time (within a byte budget: a shuffled pass reads from hundreds of shards at once); each piece
takes its samples' rows, and each sample gets its row's values as members.
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterator, Sequence
from typing import Any

from shardstream.catalog.shardspec import ShardSource
from shardstream.format.columns import column_file, read_column_table

__all__ = ["FieldCache"]

#: Bytes of fields a worker keeps (as Python values: about 64 bytes a value, counted so).
DEFAULT_FIELD_CACHE_BYTES = 128 << 20
_PYTHON_BYTES = 64


class FieldCache:
    """The attached fields of recently read shards (least recently used dropped).

    Args:
        max_bytes: Bytes of field tables kept.
    """

    def __init__(self, max_bytes: int = DEFAULT_FIELD_CACHE_BYTES) -> None:
        self._max_bytes, self._bytes = max_bytes, 0
        self._tables: collections.OrderedDict[tuple[int, str], dict[str, list[Any]]] = (
            collections.OrderedDict()
        )
        self._sizes: dict[tuple[int, str], int] = {}

    def attach(
        self, samples: Iterator[Any], source: ShardSource, local: int, name: str, store: int,
        positions: Sequence[int],
    ) -> Iterator[Any]:  # fmt: skip
        """``samples`` (read at stored ``positions`` of shard ``local`` of ``source``) with
        their fields; shards appended after the attach get None for every field."""
        if source.columns is None:
            return samples
        folder_store, columns = source.columns
        if local >= columns.num_shards:
            rows = {field: [None] * len(positions) for field in columns.fields}
        else:
            table = self._table(folder_store, column_file(columns.folder, name), store)
            rows = _rows(table, positions)
        return _with_fields(samples, rows)

    def _table(self, folder: Any, name: str, store: int) -> dict[str, list[Any]]:
        key = (store, name)
        values = self._tables.get(key)
        if values is not None:
            self._tables.move_to_end(key)
            return values
        table = read_column_table(folder, name)
        values = self._tables[key] = table.to_pydict()  # indexed per sample: Python lists
        self._sizes[key] = size = _PYTHON_BYTES * table.num_rows * max(1, table.num_columns)
        self._bytes += size
        while self._bytes > self._max_bytes and len(self._tables) > 1:
            dropped, _ = self._tables.popitem(last=False)
            self._bytes -= self._sizes.pop(dropped)
        return values


def _rows(values: dict[str, list[Any]], positions: Sequence[int]) -> dict[str, list[Any]]:
    """The fields of the rows at ``positions`` (one slice when they follow each other)."""
    if isinstance(positions, range) and positions.step == 1:
        return {field: column[positions.start : positions.stop] for field, column in values.items()}
    return {field: [column[p] for p in positions] for field, column in values.items()}


def _with_fields(samples: Iterator[Any], rows: dict[str, list[Any]]) -> Iterator[Any]:
    names = list(rows)
    values = zip(*rows.values(), strict=False)  # one row per sample read, in order
    for sample in samples:
        row = next(values, None)
        if sample is not None:  # a broken sample's placeholder (on_error="skip") stays None
            sample.update(zip(names, row or itertools.repeat(None), strict=False))
        yield sample
