"""The storage layer: the only part of shardstream that talks to files and object stores.

A :class:`Store` is a folder on local disk or a URL prefix on any store, resolved once; the
writer and the reader name files relative to it and ask it the few questions storage answers:
stat, the bytes of a range (alone, or many announced ahead), listing, exclusive create and
atomic publish. Its parts:

- ``store.py``: :class:`Store`, the API the rest of shardstream uses; shard URLs as written
  (globs expanded, list entries resolved); one writer per local destination (the lock);
  several small objects read at once;
- ``ranges.py``: :class:`~shardstream._storage.ranges.Ranges`, a reader's byte ranges of one
  store (what a streaming worker asks for: buffers, streams, announcements), and a local file
  that ends at a range's end;
- ``backends/``: one file per kind of store (local files and their memory maps, S3 and its
  client, HTTP, GCS, Azure, any other fsspec filesystem, the shard cache) and the one switch
  that picks a backend from a URL's protocol (``backends/__init__.py``);
- ``remote/``: the machinery of remote reads: ranged requests retried and resumed at the byte
  reached, spans fetched by a shared pool whose size follows the measured first-byte latency,
  announced ranges fetched ahead, reused receive buffers, and the local shard cache;
- ``options.py``: :class:`ReadOptions` (retries, read-ahead, cache), upload part sizes, and
  the open-file budget;
- ``messages.py``: credentials kept out of every message, exception and log record, and
  one-line failure diagnoses;
- ``background.py``: the training process's one thread machinery (an ordered background
  stage) and one object per process (what a forked worker inherits is never used).
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
