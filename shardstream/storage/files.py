"""File operations on a resolved fsspec filesystem: listing, moves, folder removal, atomic writes.

:class:`~shardstream.storage.Store` calls these with its filesystem and a path; they hold the
knowledge of how each kind of storage makes a write atomic or a move cheap.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import Iterator, Sequence
from typing import IO, Any, cast

from fsspec.implementations.local import LocalFileSystem

from shardstream.errors import ConfigError
from shardstream.storage.options import ReadOptions
from shardstream.storage.s3upload import open_s3_upload, put_if_absent

__all__ = [
    "atomic_write",
    "create_exclusive",
    "forget_listings",
    "is_local_fs",
    "list_files",
    "make_folder",
    "move",
    "remove_folder",
]

logger = logging.getLogger("shardstream.storage")

#: Object stores publish an object only when its upload completes, so writing straight to the
#: final key is already atomic there (a killed multipart upload never becomes visible).
_ATOMIC_PUT_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "az", "abfs", "abfss"})


def is_local_fs(fs: Any) -> bool:
    """True for the local filesystem."""
    return isinstance(fs, LocalFileSystem)


def _has_atomic_put(fs: Any) -> bool:
    protocols = {fs.protocol} if isinstance(fs.protocol, str) else set(fs.protocol)
    return bool(protocols & _ATOMIC_PUT_PROTOCOLS)


def forget_listings(fs: Any, path: str) -> None:
    """Drop cached listings: another process may have written there since we last looked."""
    if not is_local_fs(fs):
        with contextlib.suppress(Exception):
            fs.invalidate_cache(path)


def list_files(fs: Any, path: str, kind: str = "file") -> list[str]:
    """Sorted names of the files (or, with ``kind="directory"``, the folders) directly inside
    a folder; [] when it is missing."""
    forget_listings(fs, path)  # object stores have no folders: list the prefix afresh
    try:
        entries = fs.ls(path.rstrip("/"), detail=True)
    except FileNotFoundError:
        return []
    names = [e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e["type"] == kind]
    return sorted(names)


def make_folder(fs: Any, path: str, shown: str) -> None:
    """Create a folder and its parents (a no-op on object stores); ``shown`` names it.

    Raises:
        ConfigError: A local file is in the way (the folder itself, or a parent).
    """
    try:
        fs.makedirs(path, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        if not is_local_fs(fs):
            raise
        raise ConfigError(
            f"{shown}: a file is in the way (the path or a folder above it is a file); a "
            "destination is a folder, made if missing: choose another path"
        ) from None


def move(fs: Any, source: str, target: str) -> None:
    """Move one file or object so that ``target`` appears complete or not at all.

    Local files are renamed (``os.replace``). On object stores the bytes never leave the
    server: the object is copied server-side (S3 ``CopyObject``, which publishes the target
    atomically; s3fs switches to a multipart ``UploadPartCopy`` above 150 MiB, which also
    becomes visible only when it completes) and the source is deleted afterwards. A process
    killed in between leaves both, so a retried move simply copies again. Other fsspec
    filesystems use their own ``mv``.

    Raises:
        FileNotFoundError: ``source`` does not exist.
    """
    if is_local_fs(fs):
        os.replace(source, target)
    elif _has_atomic_put(fs):
        fs.cp_file(source, target)
        fs.rm_file(source)
    else:
        fs.mv(source, target)
    forget_listings(fs, target)


def remove_folder(fs: Any, path: str) -> None:
    """Delete a folder (every object under a prefix) and all it holds; missing is fine.

    On object stores this also removes the "folder" markers some filesystems keep (for
    example ``memory://``), so nothing of the folder stays listed.
    """
    forget_listings(fs, path)
    if is_local_fs(fs):
        shutil.rmtree(path, ignore_errors=True)
        return
    with contextlib.suppress(FileNotFoundError):
        fs.rm(path.rstrip("/"), recursive=True)
    forget_listings(fs, path)


@contextlib.contextmanager
def atomic_write(
    fs: Any,
    path: str,
    shown: str,
    part_size_bytes: int,
    options: ReadOptions | None = None,
    secrets: Sequence[str] = (),
) -> Iterator[IO[bytes]]:
    """Open ``path`` for writing so that it appears complete or not at all.

    Local files are written under a temporary name in the same folder, flushed to disk and then
    renamed over the target. Object stores are written in place: the data is streamed up as a
    multipart upload of ``part_size_bytes`` parts (so memory is bounded by the part size, not
    the object size; on S3 two parts upload while the next is written, each retried per
    ``options``: see :mod:`shardstream.storage.s3upload`), the object becomes visible only when
    the upload completes, and the upload is aborted if the block raises. A killed process
    leaves an unfinished multipart upload, which is never visible (a bucket lifecycle rule
    ``AbortIncompleteMultipartUpload`` frees its parts). Other fsspec filesystems get a
    temporary name and a move.
    """
    if is_local_fs(fs):
        with _local_atomic_write(path) as stream:
            yield stream
        return
    if _has_atomic_put(fs):
        upload = open_s3_upload(fs, path, shown, part_size_bytes, options or ReadOptions(), secrets)
        target = upload if upload is not None else fs.open(path, "wb", block_size=part_size_bytes)
        try:
            yield cast(IO[bytes], target)  # write, tell, flush: what the writers here use
        except BaseException:
            _discard(target, shown)
            raise
        target.close()
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


def create_exclusive(
    fs: Any, path: str, data: bytes, shown: str, options: ReadOptions | None = None
) -> bool:
    """Create ``path`` holding ``data`` unless it exists; True if this call created it.

    Local files: a complete temporary is hard-linked to the name (the link fails if the name
    exists, so two writers never both win). S3: a ``PutObject`` with ``If-None-Match: *``.
    Elsewhere, and on S3 servers without conditional writes: a check, then an atomic write (two
    writers racing in between may both write; callers compare the bytes afterwards).
    """
    if is_local_fs(fs):
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
    if _has_atomic_put(fs):
        created = put_if_absent(fs, path, data, options or ReadOptions())
        if created is not None:
            forget_listings(fs, path)
            return created
    if fs.exists(path):
        return False
    with atomic_write(fs, path, shown, max(1, len(data)), options) as stream:
        stream.write(data)
    return True
