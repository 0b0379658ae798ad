"""Every shard of a dataset in a few flat arrays: a manifest that scales to millions of shards.

A list of a million ``ShardInfo`` objects costs about a gigabyte and seconds to build. A
:class:`ShardTable` holds the same facts as columns: sample counts and byte sizes as ``int64``
arrays, checksums as raw bytes, names as one UTF-8 blob with offsets (or, for the usual
``prefix-000123.tar`` names, just a template). It is a read-only ``Sequence[ShardInfo]`` that
makes each ``ShardInfo`` only when asked, and its binary form (this module) is read back
by reference (over a memory map), so opening a dataset of 1e6 shards takes milliseconds and the
pages are shared by every process that maps them.

The binary form of a shard table (``manifest.shards``): written once, read by reference.

Layout, little-endian, every section padded to 8 bytes::

    magic    8 bytes  b"SSTSHRD\0"
    version, count, flags                     3 x uint64
    num_samples, num_bytes                    2 x count x uint64
    sha256                                    count x 32 bytes        (flag 1)
    names    template: width, first, len(prefix), len(suffix), prefix, suffix   (flag 4)
             or offsets (count + 1) x uint64 and a UTF-8 blob
    indexes  the same, "" for a shard without one                    (flag 2, template: 8)

Reading trusts nothing: sizes must fit the buffer, counts must be non-negative 64-bit integers
and every name must stay inside the dataset."""

from __future__ import annotations

import collections.abc
import dataclasses
import itertools
import mmap
import re
from collections.abc import Iterable, Iterator
from typing import Any, overload

import numpy as np

from shardstream.errors import ManifestError

__all__ = [
    "NameColumn",
    "ShardInfo",
    "ShardTable",
    "decode_table",
    "encode_table",
]


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard of a dataset.

    Attributes:
        name: File name relative to the dataset folder, e.g. ``"shard-000000.tar"``.
        num_samples: Samples (distinct keys) in the shard.
        num_bytes: Size of the shard file in bytes.
        sha256: Hex sha256 of the shard file's bytes, or None when not computed
            (``shardstream index --no-checksum``).
        index: Name of the shard's per-sample byte-offset index (``"shard-000000.idx"``), or
            ``None`` when the shard has none.
    """

    name: str
    num_samples: int
    num_bytes: int
    sha256: str | None
    index: str | None = None


_TEMPLATE = re.compile(r"(.*?)([0-9]+)([^0-9]*)")


class NameColumn(collections.abc.Sequence[str]):
    """Names as a template (``prefix``, zero-padded number from ``first``, ``suffix``) or a blob.

    Examples:
        >>> names = NameColumn.of(["shard-000000.tar", "shard-000001.tar"])
        >>> names.template, names[1]
        (('shard-', 6, '.tar', 0), 'shard-000001.tar')
    """

    def __init__(
        self,
        count: int,
        template: tuple[str, int, str, int] | None = None,
        blob: bytes | memoryview | None = None,
        offsets: np.ndarray | None = None,
    ) -> None:
        self._size, self.template = count, template
        self.blob, self.offsets = blob, offsets

    @classmethod
    def of(cls, names: Iterable[str]) -> NameColumn:
        """A column of ``names``: a template when they count up from one number, else a blob."""
        names = list(names)
        template = _template_of(names)
        if template is not None:
            return cls(len(names), template)
        encoded = [name.encode("utf-8") for name in names]
        offsets = np.zeros(len(encoded) + 1, dtype=np.uint64)
        np.cumsum([len(item) for item in encoded], out=offsets[1:])
        return cls(len(names), None, b"".join(encoded), offsets)

    def __len__(self) -> int:
        return self._size

    @overload
    def __getitem__(self, index: int) -> str: ...
    @overload
    def __getitem__(self, index: slice) -> list[str]: ...
    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        if not -self._size <= index < self._size:
            raise IndexError(f"shard {index} of {self._size}")
        index %= self._size
        if self.template is not None:
            prefix, width, suffix, first = self.template
            return f"{prefix}{first + index:0{width}d}{suffix}"
        offsets, blob = self.offsets, self.blob if self.blob is not None else b""
        start, stop = (
            (int(offsets[index]), int(offsets[index + 1])) if offsets is not None else (0, 0)
        )
        return bytes(blob[start:stop]).decode("utf-8", "surrogateescape")

    def has_duplicates(self) -> bool:
        """Whether two names are equal (never, for a template)."""
        if self.template is not None or self._size < 2:
            return False
        blob = bytes(self.blob or b"")
        edges = self.offsets.tolist() if self.offsets is not None else []
        return len({blob[a:b] for a, b in itertools.pairwise(edges)}) != self._size

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NameColumn) or len(other) != self._size:
            return NotImplemented if not isinstance(other, NameColumn) else False
        if self.template is not None and other.template is not None:
            return self.template == other.template
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


def _template_of(names: list[str]) -> tuple[str, int, str, int] | None:
    """``(prefix, width, suffix, first)`` when ``names`` count up by one from ``first``."""
    match = _TEMPLATE.fullmatch(names[0]) if names else None
    if match is None:
        return None
    prefix, digits, suffix = match.groups()
    width, first = len(digits), int(digits)
    for offset, name in enumerate(names):
        if name != f"{prefix}{first + offset:0{width}d}{suffix}":
            return None
    return prefix, width, suffix, first


class ShardTable(collections.abc.Sequence[ShardInfo]):
    """The shards of a dataset as columns; a read-only ``Sequence[ShardInfo]``.

    Attributes:
        names: Shard file names.
        num_samples: Samples per shard (``int64``).
        num_bytes: Bytes per shard (``int64``).
        sha256: Raw sha256 per shard (``uint8``, shape ``(n, 32)``), or None when not computed.
        indexes: Index file names (``""`` for none), or None when no shard has an index.

    Examples:
        >>> table = ShardTable.of([ShardInfo("shard-000000.tar", 2, 4096, "ab" * 32)])
        >>> table.total_samples, table[0].name
        (2, 'shard-000000.tar')
    """

    def __init__(
        self,
        names: NameColumn,
        num_samples: np.ndarray,
        num_bytes: np.ndarray,
        sha256: np.ndarray | None = None,
        indexes: NameColumn | None = None,
        totals: tuple[int, int] | None = None,
    ) -> None:
        self.names, self.num_samples, self.num_bytes = names, num_samples, num_bytes
        self.sha256, self.indexes = sha256, indexes
        self._totals = totals  # (samples, bytes) when the reader summed them already

    @classmethod
    def of(cls, shards: Iterable[ShardInfo]) -> ShardTable:
        """A table of ``shards`` (all with a sha256, or none)."""
        shards = list(shards)
        digests = [shard.sha256 for shard in shards]
        sha256 = None
        if shards and all(digest is not None for digest in digests):
            sha256 = np.frombuffer(bytes.fromhex("".join(digests)), np.uint8).reshape(-1, 32)  # type: ignore[arg-type]
        indexes = None
        if any(shard.index is not None for shard in shards):
            indexes = NameColumn.of(shard.index or "" for shard in shards)
        return cls(
            NameColumn.of(shard.name for shard in shards),
            np.fromiter((shard.num_samples for shard in shards), np.int64, len(shards)),
            np.fromiter((shard.num_bytes for shard in shards), np.int64, len(shards)),
            sha256,
            indexes,
        )

    @property
    def total_samples(self) -> int:
        """Samples over all shards."""
        return self._totals[0] if self._totals is not None else int(self.num_samples.sum())

    @property
    def total_bytes(self) -> int:
        """Bytes over all shards."""
        return self._totals[1] if self._totals is not None else int(self.num_bytes.sum())

    @property
    def num_indexed(self) -> int:
        """Shards that have an index (from the column, without a per-shard loop)."""
        column = self.indexes
        if column is None:
            return 0
        if column.template is not None or column.offsets is None:
            return len(column)
        return int(np.count_nonzero(np.diff(np.asarray(column.offsets))))

    def __len__(self) -> int:
        return len(self.names)

    @overload
    def __getitem__(self, index: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, index: slice) -> list[ShardInfo]: ...
    def __getitem__(self, index: int | slice) -> ShardInfo | list[ShardInfo]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        name = self.names[index]
        index %= len(self)
        digest = self.sha256[index].tobytes().hex() if self.sha256 is not None else None
        index_name = self.indexes[index] if self.indexes is not None else ""
        return ShardInfo(
            name,
            int(self.num_samples[index]),
            int(self.num_bytes[index]),
            digest,
            index_name or None,
        )

    def __iter__(self) -> Iterator[ShardInfo]:
        for index in range(len(self)):
            yield self[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (tuple, list)):
            return list(self) == list(other)
        if not isinstance(other, ShardTable):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ShardTable({len(self)} shards, {self.total_samples} samples)"


_MAGIC = b"SSTSHRD\0"
_VERSION = 1
_HAS_SHA256, _HAS_INDEXES, _TEMPLATE_NAMES, _TEMPLATE_INDEXES = 1, 2, 4, 8
_CHECKED_PER_SLICE = 1 << 20  # counts checked at a time (8 MB)


def _names_bytes(column: NameColumn) -> list[bytes]:
    """A column as sections: template fields, or offsets and blob (each padded to 8 bytes)."""
    if column.template is not None:
        prefix, width, suffix, first = column.template
        texts = [prefix.encode("utf-8"), suffix.encode("utf-8")]
        head = np.array([width, first, len(texts[0]), len(texts[1])], dtype="<u8").tobytes()
        return [head, *(_padded(text) for text in texts)]
    offsets = column.offsets if column.offsets is not None else np.zeros(1, dtype=np.uint64)
    return [offsets.astype("<u8").tobytes(), _padded(bytes(column.blob or b""))]


def _padded(data: bytes) -> bytes:
    return data + bytes(-len(data) % 8)


def encode_table(table: ShardTable) -> bytes:
    """The table's binary form (little-endian, 8-byte aligned; see :func:`decode_table`)."""
    flags = (_HAS_SHA256 if table.sha256 is not None else 0) | (
        _HAS_INDEXES if table.indexes is not None else 0
    )
    flags |= _TEMPLATE_NAMES if table.names.template is not None else 0
    if table.indexes is not None and table.indexes.template is not None:
        flags |= _TEMPLATE_INDEXES
    parts = [_MAGIC, np.array([_VERSION, len(table), flags], dtype="<u8").tobytes()]
    parts += [table.num_samples.astype("<u8").tobytes(), table.num_bytes.astype("<u8").tobytes()]
    if table.sha256 is not None:
        parts.append(_padded(table.sha256.tobytes()))
    parts += _names_bytes(table.names)
    if table.indexes is not None:
        parts += _names_bytes(table.indexes)
    return b"".join(parts)


class _Cursor:
    """Reads 8-byte aligned sections of a table buffer, refusing any that runs past its end."""

    def __init__(self, buffer: Any, where: str) -> None:
        self.buffer, self.where, self.position = buffer, where, 0

    def take(self, size: int) -> memoryview:
        padded_size = size + (-size % 8)
        if self.position + padded_size > len(self.buffer):
            raise ManifestError(
                f"{self.where}: shard table ends at byte {len(self.buffer)} but its sections "
                f"need {self.position + padded_size}; the file is truncated or corrupt"
            )
        view = memoryview(self.buffer)[self.position : self.position + size]
        self.position += padded_size
        return view

    def integers(self, count: int) -> np.ndarray:
        return np.frombuffer(self.take(8 * count), dtype="<u8")


def _names_column(cursor: _Cursor, count: int, template: bool, allow_empty: bool) -> NameColumn:
    if template:
        width, first, prefix_size, suffix_size = (int(v) for v in cursor.integers(4))
        prefix = bytes(cursor.take(prefix_size)).decode("utf-8", "surrogateescape")
        suffix = bytes(cursor.take(suffix_size)).decode("utf-8", "surrogateescape")
        column = NameColumn(count, (prefix, width, suffix, first))
        for name in (column[0], column[-1]) if count else ():
            _check_name(name, cursor.where)
        return column
    offsets = cursor.integers(count + 1)
    if offsets[0] != 0 or np.any(offsets[1:] < offsets[:-1]):
        raise ManifestError(f"{cursor.where}: shard name offsets are not increasing")
    blob = cursor.take(int(offsets[-1]))
    _check_blob_names(bytes(blob), offsets, cursor.where, allow_empty)
    return NameColumn(count, None, blob, offsets)


def _check_name(name: str, where: str) -> None:
    if not name or "\\" in name or "://" in name or name.startswith("/"):
        raise ManifestError(f"{where}: {name!r} is not a relative file name inside the dataset")
    if ".." in name.split("/"):
        raise ManifestError(f"{where}: {name!r} is not a relative file name inside the dataset")


def _check_blob_names(blob: bytes, offsets: np.ndarray, where: str, allow_empty: bool) -> None:
    """Every name relative and inside the dataset (no ``..``, ``\\``, scheme or leading ``/``)."""
    starts = offsets[:-1].astype(np.int64)
    sizes = np.diff(offsets.astype(np.int64))
    bad = None
    if not allow_empty and np.any(sizes == 0):
        bad = "an empty name"
    elif any(token in blob for token in (b"\\", b"://", b"\0")):
        bad = "a name with '\\', a URL scheme or a NUL byte"
    elif np.any(np.frombuffer(blob, np.uint8)[starts[sizes > 0]] == ord("/")):
        bad = "an absolute name"
    elif _has_parent_component(blob, offsets):
        bad = "a '..' component"
    if bad is not None:
        raise ManifestError(
            f"{where}: the shard table holds {bad}; names must stay inside the dataset"
        )


def decode_table(buffer: Any, where: str = "shard table") -> ShardTable:
    """Read a table from :func:`encode_table`'s bytes (a memory map works: nothing is copied).

    Raises:
        ManifestError: Wrong magic or version, truncation, counts that are not non-negative
            64-bit integers, or names outside the dataset. (A name listed twice is refused when
            a table is written and reported by ``shardstream verify``; checking a million
            names here would cost more than the rest of opening the dataset.)
    """
    cursor = _Cursor(buffer, where)
    if bytes(cursor.take(8)) != _MAGIC:
        raise ManifestError(f"{where}: not a shardstream shard table (bad magic)")
    version, count, flags = (int(v) for v in cursor.integers(3))
    if version != _VERSION:
        raise ManifestError(
            f"{where}: shard table version {version} is not supported; upgrade shardstream"
        )
    num_samples, total_samples = _checked_counts(cursor, count)
    num_bytes, total_bytes = _checked_counts(cursor, count)
    sha256 = None
    if flags & _HAS_SHA256:
        sha256 = np.frombuffer(cursor.take(32 * count), np.uint8).reshape(count, 32)
    names = _names_column(cursor, count, bool(flags & _TEMPLATE_NAMES), allow_empty=False)
    indexes = None
    if flags & _HAS_INDEXES:
        indexes = _names_column(cursor, count, bool(flags & _TEMPLATE_INDEXES), allow_empty=True)
    return ShardTable(names, num_samples, num_bytes, sha256, indexes, (total_samples, total_bytes))


def _checked_counts(cursor: _Cursor, count: int) -> tuple[np.ndarray, int]:
    """A column of counts, each checked non-negative, and its sum.

    Checked a slice at a time through a memory map, each slice's pages released after: at ten
    million shards the two columns are 160 MB, which opening a dataset would otherwise leave
    resident in every process (they stay in the page cache; what a pass uses comes back).
    """
    start = cursor.position
    column = cursor.integers(count).view(np.int64)
    total = 0
    for first in range(0, count, _CHECKED_PER_SLICE):
        part = column[first : first + _CHECKED_PER_SLICE]
        if part.min() < 0:
            raise ManifestError(
                f"{cursor.where}: a sample count or byte size is not a non-negative integer"
            )
        total += int(part.sum())
        _release(cursor.buffer, start + 8 * first, 8 * len(part))
    return column, total


def _release(buffer: Any, start: int, size: int) -> None:
    """Drop a read-only map's pages from this process (the file's pages stay cached)."""
    if isinstance(buffer, mmap.mmap) and hasattr(mmap, "MADV_DONTNEED"):
        low = start - start % mmap.PAGESIZE
        buffer.madvise(mmap.MADV_DONTNEED, low, start + size - low)


def _has_parent_component(blob: bytes, offsets: np.ndarray) -> bool:
    """Whether some name has a ``..`` path component (looked at only where ``..`` occurs)."""
    found = np.array([match.start() for match in re.finditer(rb"\.\.", blob)], dtype=np.int64)
    if not len(found):
        return False
    data = np.frombuffer(blob, np.uint8)
    bounds = offsets.astype(np.int64)
    before = np.isin(found, bounds) | (data[np.maximum(found - 1, 0)] == ord("/"))
    after = np.isin(found + 2, bounds) | (data[np.minimum(found + 2, len(data) - 1)] == ord("/"))
    return bool(np.any(before & after))
