"""Settings of the storage layer: how remote objects are read, and upload part sizes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_PART_SIZE_BYTES", "ReadOptions", "StorageOptions"]

#: fsspec options (credentials, ``endpoint_url``...), passed through to the filesystem.
StorageOptions = Mapping[str, Any] | None

#: Multipart upload part size for object stores: memory per open upload is about this much.
DEFAULT_PART_SIZE_BYTES = 16 * 2**20


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How shards are read from storage: retries, read-ahead and an optional local cache.

    Attributes:
        max_attempts: Tries per read (the first included) before :class:`StorageError`.
        backoff_s: First retry delay; doubles per retry, with jitter, up to ``max_backoff_s``.
        max_backoff_s: Longest delay between two tries.
        timeout_s: A read that makes no progress for this long counts as failed (stalls).
        read_ahead_bytes: Bytes fetched ahead of the reader in a background thread (remote
            URLs only); 0 turns read-ahead off. Memory per open stream is bounded by this
            (plus one GET of ``read_ahead_bytes / 4``, at most 8 MiB).
        min_requests: Background GETs in flight at once per process (S3) where the store
            answers fast, shared by all open streams: the rest of each piece is fetched while
            the caller decodes and opens other pieces.
        max_requests: The most background GETs in flight per process. Between the two, the
            count follows the store's measured first-byte latency (a GET that waits 30 ms for
            its first byte and then transfers for 10 ms needs 4x as many in flight to deliver
            the same bytes per second). Set both to
            the same value for a fixed count.
        prefetch_bytes: Bytes of announced pieces (the streaming reader announces the pieces
            it will open next) fetched before they are opened, per process (S3); 0 turns
            announcements off. Memory held ahead of the reader is bounded by this.
        cache_dir: Local folder that keeps whole remote shards for later epochs, or ``None``.
        cache_max_bytes: Size limit of ``cache_dir``; least recently used shards are evicted.

    Examples:
        >>> ReadOptions(max_attempts=4, cache_dir="/local/ssd/cache").max_attempts
        4
    """

    max_attempts: int = 8
    backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    timeout_s: float = 60.0
    read_ahead_bytes: int = 32 * 2**20
    min_requests: int = 4
    max_requests: int = 64
    prefetch_bytes: int = 64 * 2**20
    cache_dir: str | None = None
    cache_max_bytes: int | None = None
