"""Store: a folder on local disk or any fsspec URL prefix, resolved once.

Everything in shardstream that reads or writes storage holds a :class:`Store` and names files
relative to its root. The filesystem is resolved on first use in each process, so a store
pickles to DataLoader workers or tasks (as its URL and options) and reopens there.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Hashable, Iterator, Mapping, Sequence
from typing import IO, Any, cast

from shardstream.errors import ConfigError
from shardstream.storage import redact, redacterrors
from shardstream.storage.backends import Backend, backend_for
from shardstream.storage.backends.localmaps import DEFAULT_MAP_CACHE_BYTES
from shardstream.storage.options import DEFAULT_PART_SIZE_BYTES, ReadOptions, StorageOptions
from shardstream.storage.processlocal import ProcessLocal
from shardstream.storage.ranges import Ranges

__all__ = ["Store", "as_store", "is_local_url"]


def is_local_url(url: str | os.PathLike[str]) -> bool:
    """True when ``url`` is a plain path or a ``file://`` URL."""
    text = os.fspath(url)
    return "://" not in text or text.startswith("file://")


@redacterrors.redacting_methods
class Store:
    """A folder (or URL prefix) and the filesystem it lives on.

    Args:
        root: Local folder, ``file://`` URL or any fsspec URL (``s3://bucket/train``).
        storage_options: fsspec options (credentials, ``endpoint_url``...).
        read_options: Retries, read-ahead and cache for reads of remote objects.

    Examples:
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
        redact.remember_secrets(self.secrets)
        #: ``(filesystem, root path)`` for most calls, and for ranged reads (resolved once per
        #: process: forked workers resolve again).
        self._resolved: ProcessLocal[tuple[Any, str]] = ProcessLocal(self._resolve)
        self._resolved_for_reading = ProcessLocal(self._resolve_for_reading)

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

    def backend(self, name: str = "") -> Backend:
        """The backend of the store (of ``name``, when it is a full URL or the root is empty)."""
        return backend_for(self.root if self.root and "://" not in name else self.url(name))

    @property
    def secrets(self) -> list[str]:
        """Secret values in the storage options and the root's user info, for messages."""
        return [*redact.secret_values(self.storage_options), *redact.url_secrets(self.root)]

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
        return redact.redact_url(self.url(name))

    def child(self, name: str) -> Store:
        """The store of a sub-folder (or sub-prefix)."""
        return Store(self.url(name), self.storage_options, self.read_options)

    # -- resolution ----------------------------------------------------------------------------

    def _fs(self) -> tuple[Any, str]:
        """``(filesystem, root path)``, resolved once per process (forked workers re-resolve)."""
        return self._resolved.get()

    def _resolve(self) -> tuple[Any, str]:
        return self.backend().filesystem(self.root or ".", self.storage_options)

    def _resolve_for_reading(self) -> tuple[Any, str]:
        timeout_s = self.read_options.timeout_s
        return self.backend().read_filesystem(self.root, self.storage_options, timeout_s)

    def _path(self, name: str = "") -> tuple[Any, str]:
        fs, root = self._fs()
        if "://" in name:
            return self.backend(name).filesystem(name, self.storage_options)
        if not name:
            return fs, root
        if self.backend().local:
            return fs, os.path.join(root, name)
        return fs, root.rstrip("/") + "/" + name

    def local_path(self, name: str) -> str:
        """The path of ``name`` in a local store (``file://`` removed)."""
        url = self.url(name)
        return url[len("file://") :] if url.startswith("file://") else url

    def read_target(self, name: str) -> tuple[Any, str]:
        """``(filesystem, path)`` of ``name`` for ranged reads (the backend's reading client:
        on S3 its own retries are off, ours are the only ones)."""
        timeout_s = self.read_options.timeout_s
        if not self.root or "://" in name:
            return self.backend(name).read_filesystem(
                self.url(name), self.storage_options, timeout_s
            )
        fs, root = self._resolved_for_reading.get()
        return fs, root.rstrip("/") + "/" + name if name else root

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

        Examples:
            >>> store = Store("shards/train")
            >>> with store.open_read("shard-000000.tar", 1024) as f:  # doctest: +SKIP
            ...     header = f.read(512)
        """
        return self.backend(name).open_read(self, name, start, end)

    def prefetch(self, ranges: Sequence[tuple[str, int, int]], group: Hashable) -> None:
        """Announce byte ranges ``(name, start, end)`` to be opened soon, soonest first.

        On object stores they are fetched in the background (at most
        ``read_options.prefetch_bytes`` ahead) and :meth:`open_read` of the same range takes
        over the stream under way; ``group`` replaces its earlier announcements. A no-op for
        local folders.
        """
        if ranges:
            self.backend(ranges[0][0]).prefetch(self, ranges, group)

    def ranges(self, max_idle: int = 64, max_map_bytes: int = DEFAULT_MAP_CACHE_BYTES) -> Ranges:
        """A reader's byte ranges of this store's files:
        what a streaming worker asks for, one per pass. Close it when the pass ends.

        Args:
            max_idle: Local files: idle handles kept open between ranges.
            max_map_bytes: Local files: bytes kept mapped whole until closed.

        Examples:
            >>> ranges = Store("shards/train").ranges()  # doctest: +SKIP
            >>> view = ranges.view("shard-000000.tar", 0, 512)  # doctest: +SKIP
            >>> ranges.close()  # doctest: +SKIP
        """
        return cast(Ranges, self.backend().ranges(self, max_idle, max_map_bytes))

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
        return self.backend(name).read_mapped(self, name)

    def exists(self, name: str = "") -> bool:
        """True when a file or object exists at ``name``."""
        fs, path = self._path(name)
        self.backend(name).forget_listings(fs, path)
        return bool(fs.exists(path))

    def size(self, name: str) -> int:
        """Byte size of the file or object ``name``."""
        fs, path = self._path(name)
        self.backend(name).forget_listings(fs, path)
        return int(fs.size(path))

    def list_names(self, name: str = "") -> list[str]:
        """Sorted names of the files directly inside folder ``name``; [] when it is missing."""
        return self.backend(name).list_files(*self._path(name))

    def list_folders(self, name: str = "") -> list[str]:
        """Sorted names of the folders (object stores: common prefixes) inside folder ``name``."""
        return self.backend(name).list_files(*self._path(name), kind="directory")

    # -- writing -------------------------------------------------------------------------------

    def makedirs(self, name: str = "") -> None:
        """Create a folder and its parents (a no-op on object stores)."""
        self.backend(name).check_writable(self.shown(name))
        fs, path = self._path(name)
        self.backend(name).make_folder(fs, path, self.shown(name))

    @contextlib.contextmanager
    def open_atomic_write(
        self, name: str, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES
    ) -> Iterator[IO[bytes]]:
        """Write ``name`` so that it appears complete or not at all.

        Local files get a temporary name, an fsync and a rename; object stores a multipart
        upload of ``part_size_bytes`` parts that becomes visible only when it completes (and is
        aborted if the block raises). See the backend's ``atomic_write``.

        Examples:
            >>> with Store("/tmp/out").open_atomic_write("data.bin") as f:  # doctest: +SKIP
            ...     f.write(b"...")
        """
        fs, path = self._path(name)
        with (
            redacterrors.redacting_errors(),
            self.backend(name).atomic_write(
                fs, path, self.shown(name), part_size_bytes, self.read_options, self.secrets
            ) as stream,
        ):
            yield stream

    def create_exclusive(self, name: str, data: bytes) -> bool:
        """Create ``name`` holding ``data`` unless it exists; True if this call created it.

        Two writers never both succeed locally or on S3 servers with conditional writes
        (``If-None-Match: *``). See the backend's ``create_exclusive``.

        Examples:
            >>> Store("/tmp/out").create_exclusive("claim.json", b"{}")  # doctest: +SKIP
            True
        """
        fs, path = self._path(name)
        backend = self.backend(name)
        return backend.create_exclusive(fs, path, data, self.shown(name), self.read_options)

    def move(self, source: str, target: str, into: Store | None = None) -> None:
        """Move ``source`` to ``target`` under the root (of ``into``, on the same storage).

        Local files are renamed; on object stores the bytes never leave the server (a
        server-side copy, then a delete). See the backend's ``move``.
        """
        self.backend(source).check_writable(self.shown(source))
        fs, source_path = self._path(source)
        self.backend(source).move(fs, source_path, (into or self)._path(target)[1])

    def remove(self, name: str, missing_ok: bool = True) -> None:
        """Delete one file or object."""
        self.backend(name).check_writable(self.shown(name))
        fs, path = self._path(name)
        try:
            fs.rm_file(path)
        except FileNotFoundError:
            if not missing_ok:
                raise

    def remove_folder(self, name: str = "") -> None:
        """Delete a folder (or every object under a prefix) and all it holds; missing is fine."""
        self.backend(name).check_writable(self.shown(name))
        self.backend(name).remove_folder(*self._path(name))


def as_store(location: Store | str | os.PathLike[str], storage_options: StorageOptions) -> Store:
    """``location`` as a :class:`Store` (a URL or path with ``storage_options``, or a store)."""
    if isinstance(location, Store):
        return location
    return Store(location, cast(Mapping[str, Any] | None, storage_options))
