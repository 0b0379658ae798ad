"""Sample key rules: what WebDataset readers need from a key, and cheap duplicate detection."""

from __future__ import annotations

import hashlib

import numpy as np

from shardstream.errors import SourceError
from shardstream.shardwriter.records import FileTable

__all__ = ["check_key", "check_key_stem", "find_duplicate_keys", "key_hash"]


def check_key_stem(stem: str, where: str) -> None:
    """Refuse a key whose last path component contains a dot.

    WebDataset readers split a member name into key and extension at the first dot of its base
    name, so ``img.v2.jpg`` would be read back as key ``img`` with extension ``v2.jpg``.
    """
    if "." in stem:
        raise SourceError(
            f"{where}: the sample key {stem!r} contains a '.'; WebDataset readers split key and "
            "extension at the first dot of a file's base name, so this sample would be read back "
            "under another key. Rename the file without extra dots (e.g. replace '.' with '_'), "
            "or use a CSV/JSONL list with an explicit 'key' column."
        )


def check_key(key: str, where: str) -> None:
    """Check a full key (``folder/sub/name``): non-empty, no dot in its base name, no ``..``."""
    parts = key.split("/")
    if not key or any(part in ("", "..", ".") for part in parts):
        raise SourceError(
            f"{where}: unusable sample key {key!r} (empty, absolute, or with '.'/'..' "
            "components). Use relative paths below the list file, or add a 'key' column."
        )
    check_key_stem(parts[-1], where)


def key_hash(key: str) -> int:
    """A 64-bit hash of a key, stable across processes (unlike ``hash``)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


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
