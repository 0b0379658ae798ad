"""Every shard of a dataset in a few flat arrays: a manifest that scales to millions of shards.

A list of a million ``ShardInfo`` objects costs about a gigabyte and seconds to build. A
:class:`ShardTable` holds the same facts as columns: sample counts and byte sizes as ``int64``
arrays, checksums as raw bytes, names as one UTF-8 blob with offsets (or, for the usual
``prefix-000123.tar`` names, just a template). It is a read-only ``Sequence[ShardInfo]`` that
makes each ``ShardInfo`` only when asked, and its binary form (:mod:`.tablefile`) is read back
by reference (over a memory map), so opening a dataset of 1e6 shards takes milliseconds and the
pages are shared by every process that maps them.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import itertools
import re
from collections.abc import Iterable, Iterator
from typing import overload

import numpy as np

__all__ = ["NameColumn", "ShardInfo", "ShardTable"]


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
