"""How many files a process may hold open: the one place that reads ``RLIMIT_NOFILE``.

Reading from hundreds of places of a dataset at once costs file descriptors (an open shard, a
memory map, which keeps a duplicate of its file's descriptor), and many systems still start
processes with ``ulimit -n`` at 256 or 1,024. The readers size what they keep open from this
budget instead of failing half-way through an epoch with ``Too many open files``.
"""

from __future__ import annotations

import errno
import functools

from shardstream.errors import StorageError

__all__ = ["file_budget", "open_file_limit", "too_many_open_files"]

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
