"""Store: a folder on local disk or any fsspec URL prefix, resolved once.

Everything in shardstream that reads or writes storage holds a :class:`Store` and names files
relative to its root. The filesystem is resolved on first use in each process, so a store
pickles to DataLoader workers or tasks (as its URL and options) and reopens there.

Shard URLs as a user writes them: glob patterns expanded by their filesystem, relative entries
of a list resolved against the list's folder, and which named local shards are missing.

``resolve_source`` (in :mod:`shardstream._catalog.shardlist`) calls these, so a pattern or list
that names no shard, or a shard that is not there, is refused when the dataset is made rather
than in a DataLoader worker mid-epoch.

One writer per destination: a build or index run holds a lock on its local DEST.

Two builds started at once into the same folder would otherwise remove each other's temporary
files and interleave their shards. The lock is an ``flock`` on ``DEST/.shardstream.lock``: the
kernel releases it when the process dies, so a killed build never leaves a stale lock and the
next run resumes at once. Object stores have no such lock; there the build's plan file (written
once, compared on every resume) refuses a second build with other settings.

Several small objects read at once: one request latency for all of them, not one each.

A worker that starts reading a window of pieces from a remote store first needs the byte-offset
index of every shard in it. Read one after another, they cost one first-byte delay each;
:func:`read_ranges` sends the reads together, on a small per-process thread pool, so they cost
about one."""

from __future__ import annotations

import contextlib
import os
import posixpath
import time
from collections.abc import Hashable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any, cast

from shardstream._storage import messages as redact
from shardstream._storage import messages as redacterrors
from shardstream._storage.backends import Backend, backend_for
from shardstream._storage.backends.localmaps import DEFAULT_MAP_CACHE_BYTES
from shardstream._storage.background import ProcessLocal
from shardstream._storage.options import DEFAULT_PART_SIZE_BYTES, ReadOptions, StorageOptions
from shardstream._storage.ranges import Ranges
from shardstream._storage.remote.prefetch import pool_for
from shardstream.errors import ConfigError, DatasetExistsError

__all__ = [
    "LOCK_NAME",
    "Store",
    "as_store",
    "destination_lock",
    "expand_glob",
    "has_glob",
    "is_local_url",
    "missing_local_files",
    "read_ranges",
    "resolve_entry",
]


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


#: A folder with more wanted names than this is listed once instead of checked name by name
#: (on a network file system each check is a round trip; a listing is a few per thousand names).
_LIST_ABOVE = 64


def has_glob(url: str) -> bool:
    """True when ``url`` holds glob characters (``*``, ``?``, ``[``).

    HTTP(S) URLs never do: there ``?`` starts a query (a signed URL's, for example).

    Examples:
        >>> has_glob("ds/*.tar"), has_glob("https://host/a.tar?X-Amz-Signature=1")
        (True, False)
    """
    if url.startswith(("http://", "https://")):
        return False
    return any(character in url for character in "*?[")


def expand_glob(pattern: str, storage_options: StorageOptions = None) -> list[str]:
    """The files ``pattern`` matches on its filesystem, sorted ([] when none).

    Local matches are absolute paths; remote ones full URLs (``s3://bucket/key``).

    Examples:
        >>> expand_glob("shards/train-*.tar")  # doctest: +SKIP
        ['/data/shards/train-000000.tar', '/data/shards/train-000001.tar']
    """
    backend = backend_for(pattern)
    fs, path = backend.filesystem(pattern, dict(storage_options or {}))
    found = fs.glob(path, detail=True)
    names = sorted(name for name, info in found.items() if info.get("type") == "file")
    if backend.local:
        return names
    return [fs.unstrip_protocol(name) for name in names]


def resolve_entry(entry: str, list_url: str) -> str:
    """A ``.txt`` list's entry as a URL: a relative entry is relative to the list's folder.

    Examples:
        >>> resolve_entry("shards/a.tar", "s3://b/lists/train.txt")
        's3://b/lists/shards/a.tar'
        >>> resolve_entry("../a.tar", "/data/lists/train.txt")
        '/data/a.tar'
        >>> resolve_entry("s3://other/a.tar", "/data/lists/train.txt")
        's3://other/a.tar'
    """
    if "://" in entry or entry.startswith("/") or os.path.isabs(entry):
        return entry
    if "://" in list_url and not list_url.startswith("file://"):
        scheme, _, path = list_url.partition("://")
        return f"{scheme}://{posixpath.normpath(posixpath.join(posixpath.dirname(path), entry))}"
    local = list_url[len("file://") :] if list_url.startswith("file://") else list_url
    return os.path.normpath(os.path.join(os.path.dirname(local), entry))


def missing_local_files(paths: Sequence[str]) -> list[str]:
    """The local ``paths`` that are not files, in order.

    A folder holding many of them is listed once; a few are checked one by one.

    Examples:
        >>> missing_local_files(["/etc/hostname", "/no/such.tar"])  # doctest: +SKIP
        ['/no/such.tar']
    """
    by_folder: dict[str, list[str]] = {}
    for path in paths:
        by_folder.setdefault(os.path.dirname(path), []).append(path)
    present: set[str] = set()
    for folder, wanted in by_folder.items():
        if len(wanted) > _LIST_ABOVE:
            try:
                names = set(os.listdir(folder or "."))
            except OSError:  # a missing folder, or one we may not list: its names are missing
                names = set()
            present.update(path for path in wanted if os.path.basename(path) in names)
        else:
            present.update(path for path in wanted if os.path.isfile(path))
    return [path for path in paths if path not in present]


try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no flock, no lock
    fcntl = None  # type: ignore[assignment]


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


#: Reads in flight at once per process: a window's indexes (up to 64 first, see the streaming
#: reader) in one request latency. Threads start as reads are submitted, up to this many.
_MAX_THREADS = 64

_pool: ProcessLocal[ThreadPoolExecutor] = ProcessLocal(
    lambda: ThreadPoolExecutor(_MAX_THREADS, thread_name_prefix="shardstream-small-read")
)


def read_ranges(store: Store, ranges: Sequence[tuple[str, int | None]]) -> list[bytes | OSError]:
    """Bytes ``[0, end)`` of each ``(name, end)`` (``end`` None: the whole object), or the
    ``OSError`` (``StorageError`` included) that reading it raised, in the order asked.

    Local files are read in this thread (there is no latency to hide); remote objects together.

    Examples:
        >>> read_ranges(Store("shards/train"), [("shard-000000.idx", None)])  # doctest: +SKIP
    """

    def read(item: tuple[str, int | None]) -> bytes | OSError:
        name, end = item
        try:
            with store.open_read(name, 0, end) as stream:
                return stream.read()
        except OSError as error:
            return error

    if store.is_local or len(ranges) < 2:
        return [read(item) for item in ranges]
    gauge = pool_for(store.read_options).gauge

    def timed(item: tuple[str, int | None]) -> bytes | OSError:
        started = time.monotonic()
        data = read(item)
        if not isinstance(data, OSError):
            # A small object's GET is its first-byte wait: the fetch pool, which runs the
            # pieces these indexes locate next, starts with as many in flight as it asks for.
            gauge.record(time.monotonic() - started, 0.0)
        return data

    return list(_pool.get().map(timed, ranges))
