"""Compact per-file records: the whole source listing in a few flat arrays.

A listing of a million files must not become a million Python objects. :class:`FileTable` keeps
every relative path in one UTF-8 blob addressed by an int64 offset array, plus int32 labels and
int64 byte sizes (about 50 bytes per file in all). Optional blobs hold explicit keys and extra
JSON fields (CSV/JSONL sources). Slicing a table by indices gives a small table for one shard,
which is what a build task receives (it pickles cheaply to any executor).
"""

from __future__ import annotations

import dataclasses
import hashlib
from array import array
from collections.abc import Callable, Iterator

import numpy as np

from shardstream._format.keys import key_hash

__all__ = ["FileTable", "FileTableBuilder", "Record", "find_duplicate_keys"]


@dataclasses.dataclass(frozen=True)
class Record:
    """One file of a table, materialized only while it is being written."""

    path: str
    key: str
    label: int
    size: int
    extra: bytes


class _Blob:
    """Append-only UTF-8 strings in one bytearray plus an offset array."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.offsets = array("q", [0])

    def append(self, text: str) -> None:
        self.data += text.encode("utf-8")
        self.offsets.append(len(self.data))

    def append_bytes(self, raw: bytes) -> None:
        self.data += raw
        self.offsets.append(len(self.data))

    def freeze(self) -> tuple[bytes, np.ndarray]:
        return bytes(self.data), np.frombuffer(self.offsets, dtype=np.int64).copy()


@dataclasses.dataclass(frozen=True, eq=False)
class FileTable:
    """Source files as flat arrays; ``len(table)`` files, addressed by index.

    Attributes:
        root: Folder that relative paths are resolved against ("" when paths are absolute).
        paths: UTF-8 paths, concatenated; file ``i`` is ``paths[offsets[i]:offsets[i + 1]]``.
        offsets: int64 offsets into ``paths`` (length ``len + 1``).
        labels: int32 labels, -1 when a file has none.
        sizes: int64 file sizes in bytes (from the scan's stat).
        keys: Optional explicit keys blob and offsets; ``None`` means key = path minus extension.
        extras: Optional extra-field JSON blob and offsets (one JSON object per file, may be empty).
    """

    root: str
    paths: bytes
    offsets: np.ndarray
    labels: np.ndarray
    sizes: np.ndarray
    keys: tuple[bytes, np.ndarray] | None = None
    extras: tuple[bytes, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.labels)

    def path(self, index: int) -> str:
        """Relative (or absolute) path of file ``index``."""
        return _text(self.paths, self.offsets, index)

    def key(self, index: int) -> str:
        """Sample key of file ``index``: the explicit key, else the path minus its extension."""
        if self.keys is not None:
            return _text(self.keys[0], self.keys[1], index)
        path = self.path(index)
        cut = path.rfind(".")
        return path[:cut] if cut > path.rfind("/") else path

    def extra(self, index: int) -> bytes:
        """Extra-field JSON of file ``index`` (``b""`` when there is none)."""
        if self.extras is None:
            return b""
        blob, offsets = self.extras
        return blob[int(offsets[index]) : int(offsets[index + 1])]

    def records(self) -> Iterator[Record]:
        """Yield one :class:`Record` at a time, in table order."""
        for index in range(len(self)):
            yield Record(
                path=self.path(index),
                key=self.key(index),
                label=int(self.labels[index]),
                size=int(self.sizes[index]),
                extra=self.extra(index),
            )

    def take(self, indices: np.ndarray) -> FileTable:
        """A new table of the files at ``indices``, in that order."""
        indices = np.asarray(indices, dtype=np.int64)
        return FileTable(
            root=self.root,
            paths=b"",
            offsets=np.zeros(1, dtype=np.int64),
            labels=self.labels[indices],
            sizes=self.sizes[indices],
            keys=None,
            extras=None,
        )._with_blobs(self, indices)

    def _with_blobs(self, parent: FileTable, indices: np.ndarray) -> FileTable:
        paths = _gather(parent.paths, parent.offsets, indices)
        keys = None if parent.keys is None else _gather(*parent.keys, indices)
        extras = None if parent.extras is None else _gather(*parent.extras, indices)
        return dataclasses.replace(self, paths=paths[0], offsets=paths[1], keys=keys, extras=extras)

    def fingerprint(self) -> str:
        """sha256 over paths, keys, labels, sizes and extras: changes when the listing does."""
        digest = hashlib.sha256()
        digest.update(self.paths)
        for array_part in (self.offsets, self.labels, self.sizes):
            digest.update(array_part.tobytes())
        for blob in (self.keys, self.extras):
            if blob is not None:
                digest.update(blob[0])
                digest.update(blob[1].tobytes())
        return digest.hexdigest()

    @property
    def num_bytes(self) -> int:
        """Total size of all files."""
        return int(self.sizes.sum())


#: ``progress(files_found, bytes_found)`` while a source is scanned.
ScanProgress = Callable[[int, int], None]
#: Files between two calls of a scan's progress callback.
_PROGRESS_EVERY = 256


class FileTableBuilder:
    """Collects files one at a time into flat buffers, then freezes them into a table.

    ``progress`` is called every few hundred files with the files and bytes collected so far
    (a scan of millions of files takes minutes on a network file system).
    """

    def __init__(
        self, root: str, with_keys: bool = False, with_extras: bool = False,
        progress: ScanProgress | None = None,
    ) -> None:  # fmt: skip
        self.root = root
        self.progress = progress
        self._num_bytes = 0
        self._paths = _Blob()
        self._keys = _Blob() if with_keys else None
        self._extras = _Blob() if with_extras else None
        self._labels = array("i")
        self._sizes = array("q")

    def __len__(self) -> int:
        return len(self._labels)

    def add(self, path: str, label: int, size: int, key: str = "", extra: bytes = b"") -> None:
        """Append one file."""
        self._paths.append(path)
        self._labels.append(label)
        self._sizes.append(size)
        if self._keys is not None:
            self._keys.append(key)
        if self._extras is not None:
            self._extras.append_bytes(extra)
        self._num_bytes += size
        if self.progress is not None and len(self._labels) % _PROGRESS_EVERY == 0:
            self.progress(len(self._labels), self._num_bytes)

    def build(self) -> FileTable:
        """Freeze into a :class:`FileTable` (the builder can be dropped afterwards)."""
        if self.progress is not None:
            self.progress(len(self._labels), self._num_bytes)
        paths, offsets = self._paths.freeze()
        return FileTable(
            root=self.root,
            paths=paths,
            offsets=offsets,
            labels=np.frombuffer(self._labels, dtype=np.int32).copy(),
            sizes=np.frombuffer(self._sizes, dtype=np.int64).copy(),
            keys=None if self._keys is None else self._keys.freeze(),
            extras=None if self._extras is None else self._extras.freeze(),
        )


def _text(blob: bytes, offsets: np.ndarray, index: int) -> str:
    return blob[int(offsets[index]) : int(offsets[index + 1])].decode("utf-8")


def _gather(blob: bytes, offsets: np.ndarray, indices: np.ndarray) -> tuple[bytes, np.ndarray]:
    starts, ends = offsets[indices], offsets[indices + 1]
    parts = [blob[int(s) : int(e)] for s, e in zip(starts, ends, strict=False)]
    new_offsets = np.zeros(len(indices) + 1, dtype=np.int64)
    np.cumsum(ends - starts, out=new_offsets[1:])
    return b"".join(parts), new_offsets


def find_duplicate_keys(table: FileTable) -> tuple[int, int] | None:
    """Indices of two files with the same key, or ``None``; O(N) memory at 8 bytes per file.

    Keys are hashed to 64 bits and sorted; equal neighbours are confirmed by comparing the
    real keys, so a hash collision never reports a false duplicate.
    """
    hashes = np.fromiter((key_hash(table.key(i)) for i in range(len(table))), np.int64, len(table))
    order = np.argsort(hashes, kind="stable")
    sorted_hashes = hashes[order]
    for position in np.flatnonzero(sorted_hashes[1:] == sorted_hashes[:-1]):
        first, second = int(order[position]), int(order[position + 1])
        if table.key(first) == table.key(second):
            return min(first, second), max(first, second)
    return None
