"""Local files: plain opens, renames and links, and a reader's handles and whole-file maps.

Writes are atomic by a temporary name, an fsync and a rename; an exclusive create links a
complete temporary to the name (the link fails if the name exists). A reader's byte ranges come
from :class:`LocalRanges`: slices of its shards' whole-file memory maps
(:mod:`.localmaps`), or reads on file handles kept open between pieces.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from typing import IO, Any, cast

from shardstream._storage.backends.generic import Backend
from shardstream._storage.backends.localmaps import LocalRanges
from shardstream._storage.options import ReadOptions, too_many_open_files
from shardstream._storage.ranges import BoundedFile, StoreLike
from shardstream.errors import ConfigError

__all__ = ["LocalBackend"]


class LocalBackend(Backend):
    """Files on this machine (plain paths and ``file://`` URLs)."""

    name = "local"
    local = True

    def open_read(self, store: StoreLike, name: str, start: int, end: int | None) -> IO[bytes]:
        """The file opened plainly and positioned at ``start``; reads stop at ``end``."""
        try:
            stream = open(store.local_path(name), "rb")  # noqa: SIM115 - returned
        except OSError as error:
            raise too_many_open_files(error, store.shown(name)) from error
        if start:
            stream.seek(start)
        return cast(IO[bytes], stream if end is None else BoundedFile(stream, end))

    def prefetch(
        self, store: StoreLike, ranges: Sequence[tuple[str, int, int]], group: Any
    ) -> None:
        """Nothing to fetch ahead: the page cache reads ahead on its own."""

    def ranges(self, store: StoreLike, max_idle: int, max_map_bytes: int) -> LocalRanges:
        return LocalRanges(store, max_idle, max_map_bytes)

    def read_mapped(self, store: StoreLike, name: str) -> Any:
        """A read-only memory map, so every process that maps the file shares its pages (a
        large manifest costs a node one copy, not one per worker and rank)."""
        with open(store.local_path(name), "rb") as stream:
            if os.fstat(stream.fileno()).st_size == 0:
                return b""
            return mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)

    def make_folder(self, fs: Any, path: str, shown: str) -> None:
        """Create a folder and its parents.

        Raises:
            ConfigError: A file is in the way (the folder itself, or a parent).
        """
        try:
            fs.makedirs(path, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            raise ConfigError(
                f"{shown}: a file is in the way (the path or a folder above it is a file); a "
                "destination is a folder, made if missing: choose another path"
            ) from None

    def forget_listings(self, fs: Any, path: str) -> None:
        """Local listings are never cached."""

    def move(self, fs: Any, source: str, target: str) -> None:
        os.replace(source, target)

    def remove_folder(self, fs: Any, path: str) -> None:
        shutil.rmtree(path, ignore_errors=True)

    @contextlib.contextmanager
    def atomic_write(
        self, fs: Any, path: str, shown: str, part_size_bytes: int, options: ReadOptions,
        secrets: Sequence[str] = (),
    ) -> Iterator[IO[bytes]]:  # fmt: skip
        """A temporary name in the same folder, flushed to disk, then renamed over ``path``."""
        folder = os.path.dirname(path) or "."
        os.makedirs(folder, exist_ok=True)
        temporary = os.path.join(folder, f".{os.path.basename(path)}.tmp-{uuid.uuid4().hex}")
        try:
            with open(temporary, "wb") as stream:
                yield stream
                stream.flush()
                os.fsync(stream.fileno())
            os.replace(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise

    def create_exclusive(
        self, fs: Any, path: str, data: bytes, shown: str, options: ReadOptions
    ) -> bool:
        """A complete temporary hard-linked to the name: two writers never both win."""
        folder, base = os.path.split(path)
        temporary = os.path.join(folder, f".{base}.tmp-{uuid.uuid4().hex}")
        with open(temporary, "wb") as stream:
            stream.write(data)
            stream.flush()
            os.fsync(stream.fileno())
        try:
            os.link(temporary, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(temporary)
        return True
