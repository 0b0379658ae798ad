"""The one module that talks to storage (local disk or any fsspec URL).

Everything else in shardstream passes URLs (or plain paths) and ``storage_options`` here and gets
back file objects or bytes. Keeping storage behind this boundary is what lets the writer and the
reader work unchanged on local folders, ``memory://`` in tests and S3 in production.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Mapping
from typing import IO, Any, cast

import fsspec
from fsspec.implementations.local import LocalFileSystem

from shardstream._redact import redact_url
from shardstream._stream import BoundedFile

__all__ = [
    "DEFAULT_PART_SIZE_BYTES",
    "ReadOptions",
    "exists",
    "is_local",
    "join",
    "list_names",
    "makedirs",
    "move",
    "open_atomic_write",
    "open_read",
    "read_bytes",
    "remove",
    "remove_folder",
    "resolve",
    "size",
]

#: Object stores publish an object only when its upload completes, so writing straight to the
#: final key is already atomic there (a killed multipart upload never becomes visible).
_ATOMIC_PUT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})

StorageOptions = Mapping[str, Any] | None

#: Multipart upload part size for object stores: memory per open upload is about this much.
DEFAULT_PART_SIZE_BYTES = 16 * 2**20

logger = logging.getLogger("shardstream.storage")


@dataclasses.dataclass(frozen=True)
class ReadOptions:
    """How shards are read from storage: retries, read-ahead and an optional local cache.

    Attributes:
        max_attempts: Tries per read (the first included) before :class:`StorageError`.
        backoff_s: First retry delay; doubles per retry, with jitter, up to ``max_backoff_s``.
        max_backoff_s: Longest delay between two tries.
        timeout_s: A read that makes no progress for this long counts as failed (stalls).
        read_ahead_bytes: Bytes fetched ahead of the reader in a background thread (remote
            URLs only); 0 turns read-ahead off. Memory per open stream is bounded by this.
        cache_dir: Local folder that keeps whole remote shards for later epochs, or ``None``.
        cache_max_bytes: Size limit of ``cache_dir``; least recently used shards are evicted.
    """

    max_attempts: int = 8
    backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    timeout_s: float = 60.0
    read_ahead_bytes: int = 32 * 2**20
    cache_dir: str | None = None
    cache_max_bytes: int | None = None


def resolve(url: str | os.PathLike[str], storage_options: StorageOptions = None) -> tuple[Any, str]:
    """Return ``(filesystem, path)`` for a URL or local path."""
    fs, path = fsspec.core.url_to_fs(os.fspath(url), **dict(storage_options or {}))
    return fs, path


def is_local(url: str | os.PathLike[str]) -> bool:
    """True when ``url`` is a plain path or a ``file://`` URL."""
    text = os.fspath(url)
    return "://" not in text or text.startswith("file://")


def join(base: str | os.PathLike[str], name: str) -> str:
    """Join a folder URL (or path) and a relative name with exactly one ``/``."""
    text = os.fspath(base)
    if is_local(text) and "://" not in text:
        return os.path.join(text, name)
    return text.rstrip("/") + "/" + name


def open_read(
    url: str,
    storage_options: StorageOptions = None,
    read_options: ReadOptions | None = None,
    start: int = 0,
    end: int | None = None,
) -> IO[bytes]:
    """Open ``url`` for sequential binary reading of bytes ``[start, end)`` (to its end: None).

    Local files are opened plainly and positioned at ``start``; reads stop at ``end``. Remote
    objects are streamed in ranged requests covering only ``[start, end)`` (nothing is
    prefetched past ``end``), with retries that resume at the byte offset reached, read-ahead
    in a background thread and an optional local cache, as ``read_options`` says (see
    :class:`ReadOptions`). On S3 no HEAD request is made (except to fill a cache): the size and
    ETag come from the first ranged GET, and later GETs carry ``If-Match`` on that ETag.

    Raises:
        FileNotFoundError: The object does not exist (not retried).
        PermissionError: Access was denied (not retried).
        StorageError: Storage kept failing after ``read_options.max_attempts`` tries.

    Example:
        >>> with open_read("s3://bucket/data/shard-000000.tar",  # doctest: +SKIP
        ...                {"endpoint_url": "http://127.0.0.1:9000"}, start=1024) as f:
        ...     header = f.read(512)
    """
    if is_local(url):
        fs, path = resolve(url, storage_options)
        stream = fs.open(path, "rb")
        if start:
            stream.seek(start)
        return cast(IO[bytes], stream if end is None else BoundedFile(stream, end))
    from shardstream import _remote  # s3fs/aiohttp are imported only when needed

    options = read_options or ReadOptions()
    return _remote.open_remote(os.fspath(url), storage_options, options, start, end)


def read_bytes(
    url: str, storage_options: StorageOptions = None, read_options: ReadOptions | None = None
) -> bytes:
    """Read a whole (small) object, such as a manifest, with the same retries as shards."""
    with open_read(url, storage_options, read_options) as stream:
        return stream.read()


def exists(url: str, storage_options: StorageOptions = None) -> bool:
    """True when a file or object exists at ``url``."""
    fs, path = resolve(url, storage_options)
    _forget_listings(fs, path)  # another process may have written it since we last looked
    return bool(fs.exists(path))


def size(url: str, storage_options: StorageOptions = None) -> int:
    """Byte size of the file or object at ``url``."""
    fs, path = resolve(url, storage_options)
    _forget_listings(fs, path)
    return int(fs.size(path))


def list_names(folder_url: str, storage_options: StorageOptions = None) -> list[str]:
    """Names (not paths) of the files directly inside a folder, sorted; [] when it is missing."""
    fs, path = resolve(folder_url, storage_options)
    _forget_listings(fs, path)  # object stores have no folders: list the prefix afresh
    try:
        entries = fs.ls(path.rstrip("/"), detail=True)
    except FileNotFoundError:
        return []
    names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == "file"]
    return sorted(names)


def _forget_listings(fs: Any, path: str) -> None:
    if not isinstance(fs, LocalFileSystem):
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)


def makedirs(folder_url: str, storage_options: StorageOptions = None) -> None:
    """Create a folder and its parents (a no-op on object stores)."""
    fs, path = resolve(folder_url, storage_options)
    fs.makedirs(path, exist_ok=True)


def remove(url: str, storage_options: StorageOptions = None, missing_ok: bool = True) -> None:
    """Delete one file or object."""
    fs, path = resolve(url, storage_options)
    try:
        fs.rm_file(path)
    except FileNotFoundError:
        if not missing_ok:
            raise


def move(src_url: str, dst_url: str, storage_options: StorageOptions = None) -> None:
    """Move one file or object so that ``dst_url`` appears complete or not at all.

    Local files are renamed (``os.replace``). On object stores the bytes never leave the
    server: the object is copied server-side (S3 ``CopyObject``, which publishes the target
    atomically; s3fs switches to a multipart ``UploadPartCopy`` above 150 MiB, which also
    becomes visible only when it completes) and the source is deleted afterwards. A process
    killed in between leaves both, so a retried move simply copies again. Other fsspec
    filesystems use their own ``mv``.

    Args:
        src_url: The file or object to move.
        dst_url: Its new URL, on the same filesystem (replaced if it exists).
        storage_options: fsspec options (credentials, ``endpoint_url``...).

    Raises:
        FileNotFoundError: ``src_url`` does not exist.

    Example:
        >>> move("s3://bucket/out/_tmp/part-0.tar", "s3://bucket/out/shard-000000.tar",
        ...      {"endpoint_url": "http://127.0.0.1:9000"})  # doctest: +SKIP
    """
    fs, source = resolve(src_url, storage_options)
    _, target = resolve(dst_url, storage_options)
    if isinstance(fs, LocalFileSystem):
        os.replace(source, target)
    elif _protocols(fs) & _ATOMIC_PUT_PROTOCOLS:
        fs.cp_file(source, target)
        fs.rm_file(source)
    else:
        fs.mv(source, target)
    _forget_listings(fs, target)


def remove_folder(folder_url: str, storage_options: StorageOptions = None) -> None:
    """Delete a folder (or every object under a prefix) and all it holds; missing is fine.

    On object stores this also removes the "folder" markers some filesystems keep (for
    example ``memory://``), so nothing of the folder stays listed.
    """
    fs, path = resolve(folder_url, storage_options)
    _forget_listings(fs, path)
    if isinstance(fs, LocalFileSystem):
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path.rstrip("/"), recursive=True)
    _forget_listings(fs, path)


def _protocols(fs: Any) -> set[str]:
    return {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)


@contextlib.contextmanager
def open_atomic_write(
    url: str, storage_options: StorageOptions = None, part_size_bytes: int = DEFAULT_PART_SIZE_BYTES
) -> Iterator[IO[bytes]]:
    """Open ``url`` for writing so that it appears complete or not at all.

    Local files are written under a temporary name in the same folder, flushed to disk and then
    renamed over the target. Object stores are written in place: the data is streamed up as a
    multipart upload of ``part_size_bytes`` parts (so memory is bounded by the part size, not
    the object size), the object becomes visible only when the upload completes, and the upload
    is aborted if the block raises. A killed process leaves an unfinished multipart upload,
    which is never visible (a bucket lifecycle rule ``AbortIncompleteMultipartUpload`` frees
    its parts). Other fsspec filesystems get a temporary name and a move.

    Args:
        url: Destination file or object.
        storage_options: fsspec options (credentials, ``endpoint_url``...).
        part_size_bytes: Multipart upload part size on object stores (S3 needs >= 5 MiB).

    Example:
        >>> with open_atomic_write("/tmp/out/data.bin") as f:  # doctest: +SKIP
        ...     f.write(b"...")
    """
    fs, path = resolve(url, storage_options)
    if isinstance(fs, LocalFileSystem):
        with _local_atomic_write(path) as stream:
            yield stream
        return
    if _protocols(fs) & _ATOMIC_PUT_PROTOCOLS:
        stream = fs.open(path, "wb", block_size=part_size_bytes)
        try:
            yield stream
        except BaseException:
            _discard(stream, redact_url(os.fspath(url)))
            raise
        stream.close()
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


@contextlib.contextmanager
def _local_atomic_write(path: str) -> Iterator[IO[bytes]]:
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


def _discard(stream: Any, shown_url: str) -> None:
    """Abort an unfinished object-store upload so that nothing becomes visible."""
    discard = getattr(stream, "discard", None)
    if callable(discard):
        try:
            discard()
        except Exception as exc:  # the original error matters more; say what is left behind
            logger.warning(
                "%s: aborting the unfinished multipart upload failed (%s); it stays invisible "
                "but keeps its parts until a lifecycle rule removes them",
                shown_url, type(exc).__name__,
            )  # fmt: skip
    # Mark closed without committing: AbstractBufferedFile.close() would complete the upload.
    with contextlib.suppress(Exception):
        stream.closed = True
