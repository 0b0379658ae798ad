"""One writer per destination: a build or index run holds a lock on its local DEST.

Two builds started at once into the same folder would otherwise remove each other's temporary
files and interleave their shards. The lock is an ``flock`` on ``DEST/.shardstream.lock``: the
kernel releases it when the process dies, so a killed build never leaves a stale lock and the
next run resumes at once. Object stores have no such lock; there the build's plan file (written
once, compared on every resume) refuses a second build with other settings.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from shardstream.errors import DatasetExistsError
from shardstream.storage.store import Store

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock, no lock
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_NAME", "destination_lock"]

LOCK_NAME = ".shardstream.lock"


@contextlib.contextmanager
def destination_lock(dest: Store, what: str = "build") -> Iterator[None]:
    """Hold DEST's lock for the block; refuse at once if another run holds it.

    Raises:
        DatasetExistsError: Another build or index run is writing into DEST now.
    """
    if fcntl is None or not dest.is_local:
        yield
        return
    folder = dest.url()
    path = os.path.join(folder, LOCK_NAME)
    created = not os.path.isdir(folder)
    while True:
        try:
            dest.makedirs()
            descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # DEST cannot be written: the run's first write says why, and how
            yield
            return
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            raise DatasetExistsError(
                f"{dest.shown()}: another shardstream {what} is writing there now (it holds "
                f"{LOCK_NAME}); wait for it to finish, or choose another destination"
            ) from None
        try:
            same = os.fstat(descriptor).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:  # not a file that the previous holder removed meanwhile
            break
        os.close(descriptor)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        os.close(descriptor)
        if created:  # a run that failed before writing anything leaves no empty folder
            with contextlib.suppress(OSError):
                os.rmdir(folder)
