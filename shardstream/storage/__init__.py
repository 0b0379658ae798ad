"""The storage layer: the only part of shardstream that talks to fsspec and botocore.

A :class:`Store` is a folder on local disk or any fsspec URL prefix, resolved once; the writer
and the reader name files relative to it. Behind it, each file does one job:

- ``options.py``: :class:`ReadOptions` (retries, read-ahead, cache) and upload part sizes;
- ``files.py``: listing, moves, folder removal and atomic writes on a resolved filesystem;
- ``remote.py``: ranged reads of remote objects (aiobotocore directly on S3);
- ``ranged.py``: the seekable stream over ranged reads, with resume at the byte offset;
- ``readahead.py``: background prefetch of the next chunks;
- ``retry.py``: retries with backoff and the classification of storage errors;
- ``cache.py``: the local shard cache shared by DataLoader workers;
- ``limits.py``: how many files a process may keep open;
- ``lock.py``: one writer per local destination (an ``flock`` a killed run cannot leave stale);
- ``patterns.py``: shard URLs as written: globs expanded, list entries resolved, missing files;
- ``redact.py``: keeping credentials out of every message.
"""

from __future__ import annotations

from shardstream.storage.options import DEFAULT_PART_SIZE_BYTES, ReadOptions, StorageOptions
from shardstream.storage.redact import redact_options, redact_text, redact_url, secret_values
from shardstream.storage.store import Store, as_store, is_local_url

__all__ = [
    "DEFAULT_PART_SIZE_BYTES",
    "ReadOptions",
    "StorageOptions",
    "Store",
    "as_store",
    "is_local_url",
    "redact_options",
    "redact_text",
    "redact_url",
    "secret_values",
]
