"""The storage layer: the only part of shardstream that talks to files and object stores.

A :class:`Store` is a folder on local disk or a URL prefix on any store, resolved once; the
writer and the reader name files relative to it and ask it the few questions storage answers:
stat, the bytes of a range (alone, or many announced ahead), listing, exclusive create and
atomic publish. Its parts:

- ``store.py``: :class:`Store`, the API the rest of shardstream uses;
- ``ranges.py``: :class:`~shardstream._storage.ranges.Ranges`, a reader's byte ranges of one
  store (what a streaming worker asks for: buffers, streams, announcements);
- ``backends/``: one file per kind of store (local files, S3, HTTP, GCS, Azure, any other
  fsspec filesystem) and the one switch that picks a backend from a URL's protocol
  (``backends/__init__.py``);
- ``remote/``: the machinery of remote reads: ranged requests retried and resumed at the byte
  reached, spans fetched by a shared pool whose size follows the measured first-byte latency,
  announced ranges fetched ahead, reused receive buffers, several small objects at once, and
  the local shard cache;
- ``options.py``: :class:`ReadOptions` (retries, read-ahead, cache) and upload part sizes;
- ``patterns.py``: shard URLs as written: globs expanded, list entries resolved, missing files;
- ``bounded.py``, ``processlocal.py``: a local file that ends at a range's end, one object per
  process (what a forked worker inherits is never used);
- ``limits.py``, ``lock.py``, ``redact.py`` and ``redacterrors.py``, ``diagnose.py``: open-file
  budgets, one writer per local destination, keeping credentials out of messages, exceptions
  and log records, one-line failure diagnoses.
"""

from __future__ import annotations

from shardstream._storage.messages import redact_options, redact_text, redact_url, secret_values
from shardstream._storage.options import DEFAULT_PART_SIZE_BYTES, ReadOptions, StorageOptions
from shardstream._storage.store import Store, as_store, is_local_url

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
