"""The backend of any fsspec filesystem, and the base every other backend refines.

:class:`Backend` answers the storage questions with plain fsspec calls: ``ls`` for listings,
``mv`` (or a server-side copy on object stores) for moves, a temporary name and a move for
atomic writes, ``cat_file`` for ranged reads. A store with a better way to do one of them
(local files, S3...) overrides that method in its own module; everything it does not override
works as here.
"""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import IO, Any, cast

from shardstream._storage.options import ReadOptions
from shardstream._storage.ranges import Ranges, StoreLike

__all__ = ["Backend", "FsspecSource"]

logger = logging.getLogger("shardstream.storage")


class Backend:
    """How shardstream talks to one kind of store (this base: any fsspec filesystem).

    Attributes:
        name: Short name, for messages and tests.
        local: Files on this machine (no request per read; memory maps possible).
        atomic_put: An object becomes visible only when its upload completes (object stores):
            writing in place is atomic, and a move is a server-side copy and a delete.
        pooled_reads: Ranged reads may run at once from the process's fetch pool, so
            announced ranges are fetched ahead and long ranges in parallel spans.
        sizes_from_gets: A ranged read's answer tells the object's size and version, so no
            stat is needed before the first read.
        writable: Writing is possible at all (HTTP servers are read-only).
        credentials: How to give this store credentials, for the message that refuses them
            in a URL; empty when a URL's ``user:password@`` are its credentials (HTTP and most
            fsspec protocols).
    """

    name = "fsspec"
    local = False
    atomic_put = False
    pooled_reads = False
    sizes_from_gets = False
    writable = True
    credentials = ""

    # -- resolution ----------------------------------------------------------------------------

    def filesystem(self, url: str, storage_options: Mapping[str, Any]) -> tuple[Any, str]:
        """``(filesystem, path)`` of ``url`` for listing and writing."""
        import fsspec

        return cast(tuple[Any, str], fsspec.core.url_to_fs(url, **storage_options))

    def read_filesystem(
        self, url: str, storage_options: Mapping[str, Any], timeout_s: float
    ) -> tuple[Any, str]:
        """``(filesystem, path)`` of ``url`` for ranged reads (client retries off where the
        store's client has its own: :class:`~shardstream._storage.remote.retry.Retrier` owns
        them)."""
        return self.filesystem(url, storage_options)

    # -- reading -------------------------------------------------------------------------------

    def range_source(self, fs: Any, path: str, options: ReadOptions) -> Any:
        """The :class:`~shardstream._storage.remote.ranged.RangeSource` of one object."""
        return FsspecSource(fs, path)

    def open_read(self, store: StoreLike, name: str, start: int, end: int | None) -> IO[bytes]:
        """Bytes ``[start, end)`` of ``name`` as a read-only stream (see ``Store.open_read``)."""
        from shardstream._storage.remote import reading

        fs, path = store.read_target(name)
        return reading.open_remote(
            self, fs, path, store.shown(name), store.secrets, store.read_options, start, end
        )

    def prefetch(
        self, store: StoreLike, ranges: Sequence[tuple[str, int, int]], group: Hashable
    ) -> None:
        """Announce ``(name, start, end)`` ranges to be opened soon (see ``Store.prefetch``)."""
        if not self.pooled_reads:
            return
        from shardstream._storage.remote import reading

        items, fs = [], None
        for name, start, end in ranges:
            fs, path = store.read_target(name)
            items.append((path, store.shown(name), start, end))
        reading.prefetch_remote(self, fs, items, store.secrets, store.read_options, group)

    def ranges(self, store: StoreLike, max_idle: int, max_map_bytes: int) -> Any:
        """A reader's :class:`~shardstream._storage.ranges.Ranges` of ``store``'s files: with a
        ``cache_dir``, whole shards cached and read as local files
        (:class:`~.cached.CachedRanges`)."""
        if store.read_options.cache_dir:
            from shardstream._storage.backends.cached import CachedRanges

            return CachedRanges(store, max_idle, max_map_bytes)
        return Ranges(store)

    def read_mapped(self, store: StoreLike, name: str) -> Any:
        """The bytes of ``name`` (a local backend maps them instead of copying)."""
        return store.read_bytes(name)

    # -- listing -------------------------------------------------------------------------------

    def forget_listings(self, fs: Any, path: str) -> None:
        """Drop cached listings: another process may have written there since we last looked."""
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)

    def list_files(self, fs: Any, path: str, kind: str = "file") -> list[str]:
        """Sorted names of the files (or, with ``kind="directory"``, the folders) directly
        inside a folder; [] when it is missing."""
        self.forget_listings(fs, path)  # object stores have no folders: list the prefix afresh
        try:
            entries = fs.ls(path.rstrip("/"), detail=True)
        except FileNotFoundError:
            return []
        names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == kind]
        return sorted(names)

    # -- writing -------------------------------------------------------------------------------

    def make_folder(self, fs: Any, path: str, shown: str) -> None:
        """Create a folder and its parents (a no-op on object stores); ``shown`` names it."""
        fs.makedirs(path, exist_ok=True)

    def move(self, fs: Any, source: str, target: str) -> None:
        """Move one file or object so that ``target`` appears complete or not at all.

        On object stores the bytes never leave the server: the object is copied server-side
        (which publishes the target atomically) and the source is deleted afterwards. A
        process killed in between leaves both, so a retried move simply copies again. Other
        filesystems use their own ``mv``.

        Raises:
            FileNotFoundError: ``source`` does not exist.
        """
        if self.atomic_put:
            fs.cp_file(source, target)
            fs.rm_file(source)
        else:
            fs.mv(source, target)
        self.forget_listings(fs, target)

    def remove_folder(self, fs: Any, path: str) -> None:
        """Delete a folder (every object under a prefix) and all it holds; missing is fine.

        This also removes the "folder" markers some filesystems keep (for example
        ``memory://``), so nothing of the folder stays listed.
        """
        self.forget_listings(fs, path)
        with contextlib.suppress(FileNotFoundError):
            fs.rm(path.rstrip("/"), recursive=True)
        self.forget_listings(fs, path)

    @contextlib.contextmanager
    def atomic_write(
        self, fs: Any, path: str, shown: str, part_size_bytes: int, options: ReadOptions,
        secrets: Sequence[str] = (),
    ) -> Iterator[IO[bytes]]:  # fmt: skip
        """Open ``path`` for writing so that it appears complete or not at all.

        Object stores are written in place: the object becomes visible only when its upload
        completes, and the upload is aborted if the block raises. Other filesystems get a
        temporary name and a move.
        """
        self.check_writable(shown)
        if self.atomic_put:
            target = fs.open(path, "wb", block_size=part_size_bytes)
            with _discarded_on_error(target, shown):
                yield cast(IO[bytes], target)
            return
        temporary = f"{path}.tmp-{uuid.uuid4().hex}"
        try:
            with fs.open(temporary, "wb") as stream:
                yield stream
            fs.mv(temporary, path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                fs.rm_file(temporary)
            raise

    def create_exclusive(
        self, fs: Any, path: str, data: bytes, shown: str, options: ReadOptions
    ) -> bool:
        """Create ``path`` holding ``data`` unless it exists; True if this call created it.

        Here: a check, then an atomic write (two writers racing in between may both write;
        callers compare the bytes afterwards). Stores with conditional writes override this.
        """
        self.check_writable(shown)
        if fs.exists(path):
            return False
        with self.atomic_write(fs, path, shown, max(1, len(data)), options) as stream:
            stream.write(data)
        return True

    def check_writable(self, shown: str) -> None:
        """Raise a clear ``ConfigError`` when this store cannot be written to."""
        if not self.writable:
            from shardstream.errors import ConfigError

            raise ConfigError(
                f"{shown}: {self.name} stores are read-only in shardstream; write the dataset "
                "to a local folder or an object store (s3://, gs://, az://) and serve it from "
                "there"
            )


@contextlib.contextmanager
def _discarded_on_error(target: Any, shown: str) -> Iterator[None]:
    """Close (publish) ``target`` after the block; abort it instead if the block raises."""
    try:
        yield
    except BaseException:
        discard(target, shown)
        raise
    target.close()


def discard(stream: Any, shown_url: str) -> None:
    """Abort an unfinished object-store upload so that nothing becomes visible."""
    abort = getattr(stream, "discard", None)
    if callable(abort):
        try:
            abort()
        except Exception as exc:  # the original error matters more; say what is left behind
            logger.warning(
                "%s: aborting the unfinished upload failed (%s); it stays invisible but keeps "
                "its parts until a lifecycle rule removes them",
                shown_url, type(exc).__name__,
            )  # fmt: skip
    # Mark closed without committing: AbstractBufferedFile.close() would complete the upload.
    with contextlib.suppress(Exception):
        stream.closed = True


class _RangeBody:
    def __init__(self, fs: Any, path: str, offset: int, end: int) -> None:
        self._fs, self._path, self._offset, self._end = fs, path, offset, end

    def read_extent(self, num_bytes: int) -> bytes:
        end = min(self._offset + num_bytes, self._end)
        data = bytes(self._fs.cat_file(self._path, start=self._offset, end=end))
        self._offset += len(data)
        return data

    def close(self) -> None:
        """Nothing is held between ranged requests."""


class FsspecSource:
    """Ranged reads of one object of any fsspec filesystem: one ``cat_file`` per extent."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs, self.path = fs, path

    def stat(self) -> tuple[int, str | None]:
        """The object's size and version (ETag, else modification time), as fsspec says."""
        info = self.fs.info(self.path)
        version = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("created")
        return int(info["size"]), (str(version) if version is not None else None)

    def open_body(self, offset: int, end: int) -> _RangeBody:
        return _RangeBody(self.fs, self.path, offset, end)
