"""Settings of the storage layer: how remote objects are read, and upload part sizes.

How many files a process may hold open: the one place that reads ``RLIMIT_NOFILE``.

Reading from hundreds of places of a dataset at once costs file descriptors (an open shard, a
memory map, which keeps a duplicate of its file's descriptor), and many systems still start
processes with ``ulimit -n`` at 256 or 1,024. The readers size what they keep open from this
budget instead of failing half-way through an epoch with ``Too many open files``."""

from __future__ import annotations

import dataclasses
import errno
import functools
from collections.abc import Mapping
from typing import Any

from shardstream.errors import StorageError

__all__ = [
    "DEFAULT_PART_SIZE_BYTES",
    "ReadOptions",
    "StorageOptions",
    "file_budget",
    "open_file_limit",
    "too_many_open_files",
]


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


_UNLIMITED = 1 << 16
_RESERVED = 64  # the interpreter, torch's pipes and shared memory, sockets, the index reads


@functools.lru_cache(maxsize=1)
def open_file_limit() -> int:
    """The process's soft limit on open files (65,536 when unlimited or unknown)."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):  # no resource module (Windows)
        return _UNLIMITED
    return _UNLIMITED if soft == resource.RLIM_INFINITY else int(soft)


def file_budget(share: float, cap: int) -> int:
    """A ``share`` of the open files left after a reserve, at most ``cap`` (at least 0).

    Examples:
        >>> 0 <= file_budget(0.5, 4096) <= 4096
        True
    """
    return max(0, min(cap, int((open_file_limit() - _RESERVED) * share)))


def too_many_open_files(error: OSError, path: str) -> OSError:
    """``error`` itself, or, when it is the open-file limit, a StorageError that says so.

    Examples:
        >>> print(too_many_open_files(OSError(errno.EMFILE, "Too many open files"), "a.tar"))
        ... # doctest: +ELLIPSIS
        [Errno 24] a.tar: this process may open only ... files (ulimit -n) ...
    """
    if error.errno not in (errno.EMFILE, errno.ENFILE):
        return error
    return StorageError(
        errno.EMFILE,
        f"{path}: this process may open only {open_file_limit()} files (ulimit -n) and has "
        "them all open; raise the limit (`ulimit -n 65536` in the shell that starts training, "
        "or resource.setrlimit(RLIMIT_NOFILE) before the DataLoader starts) or read from fewer "
        "places at once (StreamOptions(num_open=...))",
    )
