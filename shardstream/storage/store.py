"""Store: a folder on local disk or any fsspec URL prefix, resolved once.

Everything in shardstream that reads or writes storage holds a :class:`Store` and names files
relative to its root. The filesystem is resolved on first use in each process, so a store
pickles to DataLoader workers or tasks (as its URL and options) and reopens there.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import IO, Any, cast

from shardstream.errors import ConfigError
from shardstream.storage import files
from shardstream.storage.bounded import BoundedFile
from shardstream.storage.limits import too_many_open_files
from shardstream.storage.options import DEFAULT_PART_SIZE_BYTES, ReadOptions, StorageOptions
from shardstream.storage.redact import redact_url, secret_values

__all__ = ["Store", "as_store", "is_local_url"]


def is_local_url(url: str | os.PathLike[str]) -> bool:
    """True when ``url`` is a plain path or a ``file://`` URL."""
    text = os.fspath(url)
    return "://" not in text or text.startswith("file://")


class Store:
    """A folder (or URL prefix) and the filesystem it lives on.

    Args:
        root: Local folder, ``file://`` URL or any fsspec URL (``s3://bucket/train``).
        storage_options: fsspec options (credentials, ``endpoint_url``...).
        read_options: Retries, read-ahead and cache for reads of remote objects.

    Example:
        >>> store = Store("s3://bucket/train", {"endpoint_url": "http://127.0.0.1:9000"})
        >>> store.url("manifest.json")
        's3://bucket/train/manifest.json'
    """

    def __init__(
        self, root: str | os.PathLike[str], storage_options: StorageOptions = None,
        read_options: ReadOptions | None = None,
    ) -> None:  # fmt: skip
        self.root = os.fspath(root)
        self.storage_options: dict[str, Any] = dict(storage_options or {})
        self.read_options = read_options or ReadOptions()
        self._resolved: tuple[int, Any, str] | None = None
        self._resolved_for_reading: tuple[int, Any, str] | None = None

    @classmethod
    def for_urls(
        cls,
        urls: Sequence[str],
        storage_options: StorageOptions = None,
        read_options: ReadOptions | None = None,
    ) -> tuple[Store, list[str]]:
        """A store at the deepest folder that holds every URL, and the URLs' names under it.

        Raises:
            ConfigError: The URLs are on different storage (local and S3, two buckets...).
        """
        schemes = {url.split("://", 1)[0] if "://" in url else "file" for url in urls}
        if len(schemes) > 1:
            raise ConfigError(
                f"shard URLs on different storage ({', '.join(sorted(schemes))}); one source "
                "reads from one filesystem: make a source per filesystem"
            )
        prefix = os.path.commonprefix(list(urls))  # noqa: RUF071 - cut at the last "/" below
        root = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if root.endswith(":") or root.endswith(":/"):  # only the scheme is shared
            root = ""
        names = [url[len(root) + 1 :] if root else url for url in urls]
        return cls(root, storage_options, read_options), names

    # -- identity ------------------------------------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        return {"root": self.root, "options": self.storage_options, "read": self.read_options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["root"], state["options"], state["read"])  # type: ignore[misc]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Store) and self.__getstate__() == other.__getstate__()

    def __hash__(self) -> int:
        return hash(self.root)

    def __repr__(self) -> str:
        return f"Store({self.shown()!r})"

    @property
    def is_local(self) -> bool:
        """True for local folders (plain paths and ``file://`` URLs)."""
        return is_local_url(self.root)

    @property
    def secrets(self) -> list[str]:
        """Secret values in the storage options, to scrub from messages."""
        return secret_values(self.storage_options)

    def url(self, name: str = "") -> str:
        """The full URL (or path) of ``name`` under the root; a full URL is returned as is."""
        if not name:
            return self.root
        if not self.root or "://" in name:
            return name
        if self.is_local and "://" not in self.root:
            return os.path.join(self.root, name)
        return self.root.rstrip("/") + "/" + name

    def shown(self, name: str = "") -> str:
        """``url(name)`` with credentials removed, for messages."""
        return redact_url(self.url(name))

    def child(self, name: str) -> Store:
        """The store of a sub-folder (or sub-prefix)."""
        return Store(self.url(name), self.storage_options, self.read_options)

    # -- resolution ----------------------------------------------------------------------------

    def _fs(self) -> tuple[Any, str]:
        """``(filesystem, root path)``, resolved once per process (forked workers re-resolve)."""
        if self._resolved is None or self._resolved[0] != os.getpid():
            import fsspec

            fs, path = fsspec.core.url_to_fs(self.root or ".", **self.storage_options)
            self._resolved = (os.getpid(), fs, path)
        return self._resolved[1], self._resolved[2]

    def _path(self, name: str = "") -> tuple[Any, str]:
        fs, root = self._fs()
        if "://" in name:
            import fsspec

            return fsspec.core.url_to_fs(name, **self.storage_options)
        if not name:
            return fs, root
        if files.is_local_fs(fs):
            return fs, os.path.join(root, name)
        return fs, root.rstrip("/") + "/" + name

    def _local_path(self, name: str) -> str:
        url = self.url(name)
        return url[len("file://") :] if url.startswith("file://") else url

    # -- reading -------------------------------------------------------------------------------

    def open_read(self, name: str = "", start: int = 0, end: int | None = None) -> IO[bytes]:
        """Open bytes ``[start, end)`` of ``name`` (to its end: None) for binary reading.

        Local files are opened plainly and positioned at ``start``; reads stop at ``end``.
        Remote objects stream in ranged requests covering only ``[start, end)``, with retries
        that resume at the byte offset reached, read-ahead in a background thread and an
        optional local cache, as the store's :class:`ReadOptions` say. On S3 no HEAD request
        is made (except to fill a cache): the size and ETag come from the first ranged GET,
        and later GETs carry ``If-Match`` on that ETag.

        Raises:
            FileNotFoundError: The object does not exist (not retried).
            PermissionError: Access was denied (not retried).
            StorageError: Storage kept failing after ``read_options.max_attempts`` tries.

        Example:
            >>> store = Store("shards/train")
            >>> with store.open_read("shard-000000.tar", 1024) as f:  # doctest: +SKIP
            ...     header = f.read(512)
        """
        if is_local_url(self.url(name)):
            try:
                stream = open(self._local_path(name), "rb")  # noqa: SIM115 - returned
            except OSError as error:
                raise too_many_open_files(error, self.shown(name)) from error
            if start:
                stream.seek(start)
            return cast(IO[bytes], stream if end is None else BoundedFile(stream, end))
        from shardstream.storage import remote  # s3fs/aiohttp are imported only when needed

        fs, path = self._read_fs(name)
        return remote.open_remote(
            fs, path, self.shown(name), self.secrets, self.read_options, start, end
        )

    def prefetch(self, ranges: Sequence[tuple[str, int, int]], group: Hashable) -> None:
        """Announce byte ranges ``(name, start, end)`` to be opened soon, soonest first.

        On object stores they are fetched in the background (at most
        ``read_options.prefetch_bytes`` ahead) and :meth:`open_read` of the same range takes
        over the stream under way; ``group`` replaces its earlier announcements (drop them
        with :func:`shardstream.storage.hints.forget`). A no-op for local folders.
        """
        if self.is_local or not ranges:
            return
        from shardstream.storage import remote

        items, fs = [], None
        for name, start, end in ranges:
            fs, path = self._read_fs(name)
            items.append((path, self.shown(name), start, end))
        remote.prefetch_remote(fs, items, self.secrets, self.read_options, group)

    def _read_fs(self, name: str) -> tuple[Any, str]:
        """The filesystem for reading: on S3 its own retries are off (ours are the only ones)."""
        from shardstream.storage import remote

        if self._resolved_for_reading is None or self._resolved_for_reading[0] != os.getpid():
            fs, root = remote.read_filesystem(
                self.root or self.url(name), self.storage_options, self.read_options.timeout_s
            )
            self._resolved_for_reading = (os.getpid(), fs, root)
        fs, root = self._resolved_for_reading[1], self._resolved_for_reading[2]
        if not self.root or "://" in name:
            return remote.read_filesystem(
                self.url(name), self.storage_options, self.read_options.timeout_s
            )
        return fs, root.rstrip("/") + "/" + name if name else root

    def read_bytes(self, name: str) -> bytes:
        """Read a whole (small) object, such as an index, with the same retries as shards."""
        with self.open_read(name) as stream:
            return stream.read()

    def read_mapped(self, name: str) -> Any:
        """The bytes of ``name`` without a private copy where possible.

        A local file is memory-mapped read-only, so every process that maps it shares the
        same pages (a large manifest costs a node one copy, not one per worker and rank); a
        remote object is read into memory. Either way the result supports the buffer protocol.
        """
        if not is_local_url(self.url(name)):
            return self.read_bytes(name)
        with open(self._local_path(name), "rb") as stream:
            if os.fstat(stream.fileno()).st_size == 0:
                return b""
            return mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)

    def exists(self, name: str = "") -> bool:
        """True when a file or object exists at ``name``."""
        fs, path = self._path(name)
        files.forget_listings(fs, path)
        return bool(fs.exists(path))

    def size(self, name: str) -> int:
        """Byte size of the file or object ``name``."""
        fs, path = self._path(name)
        files.forget_listings(fs, path)
        return int(fs.size(path))

    def list_names(self, name: str = "") -> list[str]:
        """Sorted names of the files directly inside folder ``name``; [] when it is missing."""
        return files.list_files(*self._path(name))

    def list_folders(self, name: str = "") -> list[str]:
        """Sorted names of the folders (object stores: common prefixes) inside folder ``name``."""
        return files.list_files(*self._path(name), kind="directory")

    # -- writing -------------------------------------------------------------------------------

    def makedirs(self, name: str = "") -> None:
        """Create a folder and its parents (a no-op on object stores)."""
        fs, path = self._path(name)
        files.make_folder(fs, path, self.shown(name))

    @contextlib.contextmanager
    def open_atomic_write(
        self, name: str, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES
    ) -> Iterator[IO[bytes]]:
        """Write ``name`` so that it appears complete or not at all.

        Local files get a temporary name, an fsync and a rename; object stores a multipart
        upload of ``part_size_bytes`` parts that becomes visible only when it completes (and is
        aborted if the block raises). See :func:`shardstream.storage.files.atomic_write`.

        Example:
            >>> with Store("/tmp/out").open_atomic_write("data.bin") as f:  # doctest: +SKIP
            ...     f.write(b"...")
        """
        fs, path = self._path(name)
        with files.atomic_write(
            fs, path, self.shown(name), part_size_bytes, self.read_options, self.secrets
        ) as stream:
            yield stream

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Create ``name`` holding ``data`` unless it exists; True if this call created it.

        Two writers never both succeed locally or on S3 servers with conditional writes
        (``If-None-Match: *``). See :func:`shardstream.storage.files.create_exclusive`.

        Example:
            >>> Store("/tmp/out").create_exclusive("claim.json", b"{}")  # doctest: +SKIP
            True
        """
        fs, path = self._path(name)
        return files.create_exclusive(fs, path, data, self.shown(name), self.read_options)

    def move(self, source: str, target: str, into: Store | None = None) -> None:
        """Move ``source`` to ``target`` under the root (of ``into``, on the same storage).

        Local files are renamed; on object stores the bytes never leave the server (a
        server-side copy, then a delete). See :func:`shardstream.storage.files.move`.
        """
        fs, source_path = self._path(source)
        files.move(fs, source_path, (into or self)._path(target)[1])

    def remove(self, name: str, missing_ok: bool = True) -> None:
        """Delete one file or object."""
        fs, path = self._path(name)
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_folder(self, name: str = "") -> None:
        """Delete a folder (or every object under a prefix) and all it holds; missing is fine."""
        files.remove_folder(*self._path(name))


def as_store(location: Store | str | os.PathLike[str], storage_options: StorageOptions) -> Store:
    """``location`` as a :class:`Store` (a URL or path with ``storage_options``, or a store)."""
    if isinstance(location, Store):
        return location
    return Store(location, cast(Mapping[str, Any] | None, storage_options))
