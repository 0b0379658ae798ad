"""Checking a manifest's fields one by one: a manifest is data read from storage, too.

Every check raises :class:`~shardstream.errors.ManifestError` naming the manifest and the field,
so a corrupt or hostile manifest is refused before anything reads a shard through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardstream.errors import ManifestError
from shardstream.format.shardtable import ShardInfo, ShardTable

__all__ = [
    "check_unique",
    "is_relative_name",
    "optional_names",
    "optional_root",
    "optional_view",
    "shard_info",
]


def optional_root(root: Any, where: str) -> str | None:
    """A ``shard_root``/``index_root``: absent, or a non-empty URL or path."""
    if root is not None and (not isinstance(root, str) or not root):
        raise ManifestError(f"{where}: a root must be a non-empty URL or path, got {root!r}")
    return root


def optional_view(view: Any, where: str) -> dict[str, Any] | None:
    """A view's description: absent, or an object with a ``select`` object."""
    if view is not None and not (isinstance(view, dict) and isinstance(view.get("select"), dict)):
        raise ManifestError(f"{where}: a view must be an object with a 'select' object")
    return view


def check_unique(shards: ShardTable, where: str) -> None:
    """Refuse a table that lists a shard twice."""
    if shards.names.has_duplicates():
        raise ManifestError(f"{where}: lists a shard twice; the manifest is corrupt")


def optional_names(names: Sequence[str] | None) -> tuple[str, ...] | None:
    """Class names: absent, or a list (of strings)."""
    if names is not None and not isinstance(names, list):
        raise TypeError(f"class_names must be a list or null, not {type(names).__name__}")
    return None if names is None else tuple(str(name) for name in names)


_HEX = frozenset("0123456789abcdef")


def shard_info(entry: Any, where: str) -> ShardInfo:
    """One ``shards`` entry, checked field by field: a manifest is data from storage too."""
    if not isinstance(entry, dict):
        raise TypeError(f"a shard entry must be an object, not {type(entry).__name__}")
    shard = ShardInfo(**entry)
    problem = None
    for field in ("num_samples", "num_bytes"):
        value = getattr(shard, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problem = f"{field} {value!r} is not a non-negative integer"
    digest = shard.sha256
    if digest is not None and (
        not isinstance(digest, str) or len(digest) != 64 or set(digest) - _HEX
    ):
        problem = f"sha256 {digest!r} is not 64 lowercase hex digits (or null)"
    for field in ("name", "index"):
        name = getattr(shard, field)
        if field == "index" and name is None:
            continue
        if not is_relative_name(name):
            problem = f"{field} {name!r} is not a relative file name inside the dataset"
    if problem is not None:
        raise ManifestError(f"{where}: shard entry {entry.get('name')!r}: {problem}")
    return shard


def is_relative_name(name: Any) -> bool:
    """A name that stays inside the dataset folder: relative, no ``..``, no scheme."""
    if not isinstance(name, str) or not name or "\\" in name or "://" in name:
        return False
    return not name.startswith("/") and ".." not in name.split("/")
