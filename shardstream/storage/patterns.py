"""Shard URLs as a user writes them: glob patterns expanded by their filesystem, relative entries
of a list resolved against the list's folder, and which named local shards are missing.

``resolve_source`` (in :mod:`shardstream.catalog.shardlist`) calls these, so a pattern or list
that names no shard, or a shard that is not there, is refused when the dataset is made rather
than in a DataLoader worker mid-epoch.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Sequence

from shardstream.storage.backends import backend_for
from shardstream.storage.options import StorageOptions

__all__ = ["expand_glob", "has_glob", "missing_local_files", "resolve_entry"]

#: A folder with more wanted names than this is listed once instead of checked name by name
#: (on a network file system each check is a round trip; a listing is a few per thousand names).
_LIST_ABOVE = 64


def has_glob(url: str) -> bool:
    """True when ``url`` holds glob characters (``*``, ``?``, ``[``).

    HTTP(S) URLs never do: there ``?`` starts a query (a signed URL's, for example).

    Examples:
        >>> has_glob("ds/*.tar"), has_glob("https://host/a.tar?X-Amz-Signature=1")
        (True, False)
    """
    if url.startswith(("http://", "https://")):
        return False
    return any(character in url for character in "*?[")


def expand_glob(pattern: str, storage_options: StorageOptions = None) -> list[str]:
    """The files ``pattern`` matches on its filesystem, sorted ([] when none).

    Local matches are absolute paths; remote ones full URLs (``s3://bucket/key``).

    Examples:
        >>> expand_glob("shards/train-*.tar")  # doctest: +SKIP
        ['/data/shards/train-000000.tar', '/data/shards/train-000001.tar']
    """
    backend = backend_for(pattern)
    fs, path = backend.filesystem(pattern, dict(storage_options or {}))
    found = fs.glob(path, detail=True)
    names = sorted(name for name, info in found.items() if info.get("type") == "file")
    if backend.local:
        return names
    return [fs.unstrip_protocol(name) for name in names]


def resolve_entry(entry: str, list_url: str) -> str:
    """A ``.txt`` list's entry as a URL: a relative entry is relative to the list's folder.

    Examples:
        >>> resolve_entry("shards/a.tar", "s3://b/lists/train.txt")
        's3://b/lists/shards/a.tar'
        >>> resolve_entry("../a.tar", "/data/lists/train.txt")
        '/data/a.tar'
        >>> resolve_entry("s3://other/a.tar", "/data/lists/train.txt")
        's3://other/a.tar'
    """
    if "://" in entry or entry.startswith("/") or os.path.isabs(entry):
        return entry
    if "://" in list_url and not list_url.startswith("file://"):
        scheme, _, path = list_url.partition("://")
        return f"{scheme}://{posixpath.normpath(posixpath.join(posixpath.dirname(path), entry))}"
    local = list_url[len("file://") :] if list_url.startswith("file://") else list_url
    return os.path.normpath(os.path.join(os.path.dirname(local), entry))


def missing_local_files(paths: Sequence[str]) -> list[str]:
    """The local ``paths`` that are not files, in order.

    A folder holding many of them is listed once; a few are checked one by one.

    Examples:
        >>> missing_local_files(["/etc/hostname", "/no/such.tar"])  # doctest: +SKIP
        ['/no/such.tar']
    """
    by_folder: dict[str, list[str]] = {}
    for path in paths:
        by_folder.setdefault(os.path.dirname(path), []).append(path)
    present: set[str] = set()
    for folder, wanted in by_folder.items():
        if len(wanted) > _LIST_ABOVE:
            try:
                names = set(os.listdir(folder or "."))
            except OSError:  # a missing folder, or one we may not list: its names are missing
                names = set()
            present.update(path for path in wanted if os.path.basename(path) in names)
        else:
            present.update(path for path in wanted if os.path.isfile(path))
    return [path for path in paths if path not in present]
