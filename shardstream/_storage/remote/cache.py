"""A local folder that keeps whole remote shards for later epochs, least recently used evicted.

Several DataLoader workers (processes) may share one folder, so every step is safe to race:
a shard is downloaded under a unique temporary name and renamed into place only when all of
its bytes arrived (``os.replace`` is atomic); a cache hit opens the file and
then "touches" it (its mtime is the last-use time); eviction tolerates files that another
process removed first, and an open file stays readable after it is evicted (POSIX unlink).

Cache entries are named by a hash of the object URL (credentials removed), its size and its
ETag, so a rewritten object never hits an old entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Iterator
from typing import IO

from shardstream._storage.background import ProcessLock

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: processes may download a shard twice
    fcntl = None  # type: ignore[assignment]

__all__ = ["CacheWriter", "ShardCache"]

logger = logging.getLogger("shardstream.storage")

_SUFFIX = ".shard"
#: Temporary files older than this were left by a killed process and may be removed.
_STALE_TEMP_S = 3600.0
_LOCK_SUFFIX = ".lock"
#: Per entry, held through its download: a forked child finds them unlocked.
_THREAD_LOCKS: dict[str, ProcessLock] = {}
_THREAD_LOCKS_GUARD = ProcessLock()


class ShardCache:
    """The cache folder.

    Args:
        folder: Local folder (created if missing).
        max_bytes: Size limit; ``None`` means unlimited.
    """

    def __init__(self, folder: str, max_bytes: int | None) -> None:
        self.folder, self.max_bytes = os.path.abspath(folder), max_bytes
        os.makedirs(self.folder, exist_ok=True)

    def path_for(self, url: str, size: int, etag: str | None) -> str:
        """The cache file for one version of one object."""
        digest = hashlib.sha256(f"{url}\0{size}\0{etag or ''}".encode()).hexdigest()[:40]
        return os.path.join(self.folder, digest + _SUFFIX)

    def fits(self, size: int) -> bool:
        """True when an object of ``size`` bytes may be cached at all."""
        return self.max_bytes is None or size <= self.max_bytes

    def open_cached(self, path: str, size: int) -> IO[bytes] | None:
        """Open a cache hit and mark it used, or return ``None`` on a miss."""
        try:
            stream = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
        except FileNotFoundError:
            return None
        if os.fstat(stream.fileno()).st_size != size:  # never produced by us; be safe
            stream.close()
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            return None
        with contextlib.suppress(FileNotFoundError):
            os.utime(path)
        return stream

    @contextlib.contextmanager
    def lock(self, path: str) -> Iterator[None]:
        """Hold the download lock of one entry (threads of this process, and other processes).

        Readers of many pieces of one shard wait here for a single download instead of each
        fetching the shard. The lock files are empty and stay next to the entries.
        """
        with _THREAD_LOCKS_GUARD:
            thread_lock = _THREAD_LOCKS.setdefault(path, ProcessLock())
        with thread_lock:
            if fcntl is None:
                yield
                return
            with open(path + _LOCK_SUFFIX, "ab") as lock_file:
                fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)

    def start(self, path: str, size: int) -> CacheWriter | None:
        """A writer that fills ``path`` while the object streams, or ``None`` if it cannot."""
        if not self.fits(size):
            return None
        try:
            return CacheWriter(self, path, size)
        except OSError as exc:
            logger.warning("cache folder %s is not writable (%s); not caching", self.folder, exc)
            return None

    def evict(self, keep: str | None = None) -> None:
        """Remove least recently used entries until the folder holds at most ``max_bytes``."""
        entries, total = self._entries()
        if self.max_bytes is None:
            return
        for _mtime_s, num_bytes, path in sorted(entries):
            if total <= self.max_bytes:
                break
            if path == keep:
                continue
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                logger.debug("evicted %s (%d bytes) from the shard cache", path, num_bytes)
            total -= num_bytes

    def _entries(self) -> tuple[list[tuple[float, int, str]], int]:
        entries, total, now = [], 0, time.time()
        with os.scandir(self.folder) as listing:
            for entry in listing:
                try:
                    info = entry.stat()
                except FileNotFoundError:
                    continue  # removed by another worker meanwhile
                if entry.name.endswith(_SUFFIX):
                    entries.append((info.st_mtime, info.st_size, entry.path))
                    total += info.st_size
                elif ".tmp-" in entry.name and now - info.st_mtime > _STALE_TEMP_S:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
        return entries, total


class CacheWriter:
    """Writes one object into the cache as it streams; publishes it only when complete."""

    def __init__(self, cache: ShardCache, path: str, size: int) -> None:
        self.cache, self.path, self.size = cache, path, size
        self.temporary = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex}"
        self._file: IO[bytes] | None = open(self.temporary, "wb")  # noqa: SIM115
        self.written = 0

    def write(self, extent: bytes | bytearray | memoryview) -> None:
        """Append an extent; on a disk error, give up caching (the read itself goes on)."""
        if self._file is None:
            return
        try:
            self._file.write(extent)
            self.written += len(extent)
        except OSError as exc:
            logger.warning("writing the shard cache failed (%s); not caching %s", exc, self.path)
            self.abort()

    def commit(self) -> None:
        """Publish the file if every byte arrived, then evict old entries."""
        if self._file is None:
            return
        if self.written != self.size:  # the stream was closed early: nothing to keep
            self.abort()
            return
        file, self._file = self._file, None
        try:
            file.close()
            os.replace(self.temporary, self.path)
        except OSError as exc:
            logger.warning("publishing the shard cache entry failed (%s)", exc)
            self._remove_temporary()
            return
        self.cache.evict(keep=self.path)

    def abort(self) -> None:
        """Drop the partial file."""
        if self._file is not None:
            file, self._file = self._file, None
            with contextlib.suppress(OSError):
                file.close()
        self._remove_temporary()

    def _remove_temporary(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.temporary)
