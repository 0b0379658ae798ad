"""Reading tar shards: members, then samples grouped by key. Torch-free.

A hand-written parser instead of :mod:`tarfile`: it reads each header once, understands ustar
prefixes, GNU long names and PAX paths/sizes, transparently gunzips ``.tar.gz``/``.tgz``, can
hop over data it does not need (seeking when the stream allows) and knows the byte offset of
every sample, which is what lets a reader start in the middle of a shard.

Members that are not regular files (directories, links) are hopped over and counted in
:attr:`TarReader.skipped_members`; :mod:`shardstream.format.samples` groups the file members
into samples.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from typing import IO, Any, cast

from shardstream.errors import ShardFormatError
from shardstream.format.tarheader import (
    BLOCK,
    FILE_TYPES,
    MAX_EXTENDED_BYTES,
    check_header,
    header_name,
    padded,
    parse_pax,
)

__all__ = [
    "DEFAULT_MAX_MEMBER_BYTES",
    "Sample",
    "TarReader",
    "is_gzip_name",
    "open_tar",
    "stream_size",
]

Sample = dict[str, Any]
_ZERO = bytes(BLOCK)
#: Default largest member read into memory (a documented ``StreamOptions`` setting).
DEFAULT_MAX_MEMBER_BYTES = 1 << 30
_STEP_BYTES = 16 << 20


class _Prepend:
    """A read-only stream that returns ``head`` before the rest of ``stream``."""

    def __init__(self, head: bytes, stream: IO[bytes]) -> None:
        self._head, self._stream = head, stream

    def read(self, size: int = -1) -> bytes:
        if not self._head:
            return self._stream.read(size)
        if size < 0:
            data, self._head = self._head + self._stream.read(), b""
            return data
        data, self._head = self._head[:size], self._head[size:]
        return data + self._stream.read(size - len(data)) if size > len(data) else data


def is_gzip_name(url: str) -> bool:
    """True for ``.tar.gz`` / ``.tgz`` names (compressed shards cannot be read by byte range)."""
    return url.endswith((".tar.gz", ".tgz"))


def open_tar(
    stream: IO[bytes], url: str, max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
) -> TarReader:
    """Wrap a byte stream at offset 0 as a :class:`TarReader`, gunzipping gzip data.

    Gzip is recognised by its magic bytes (read from the same stream, so no extra request).
    The stream's size, when known, bounds what headers may declare.
    """
    head = stream.read(2)
    if head == b"\x1f\x8b":
        gunzipped = gzip.GzipFile(fileobj=cast(IO[bytes], _Prepend(head, stream)), mode="rb")
        reader = TarReader(gunzipped, url, max_member_bytes=max_member_bytes)
        reader.compressed = True
        return reader
    size = stream_size(stream)
    if _is_seekable(stream):
        stream.seek(0)
        return TarReader(stream, url, True, size=size, max_member_bytes=max_member_bytes)
    return TarReader(_Prepend(head, stream), url, size=size, max_member_bytes=max_member_bytes)


class TarReader:
    """Sequential reader of tar members with byte offsets; can hop over member data.

    Nothing a header declares is believed blindly: a member larger than ``max_member_bytes``,
    or reaching past the known end of the shard (``end``, else ``size``), is a
    :class:`ShardFormatError` before any memory is allocated for it, and data is read in
    bounded steps, so memory grows with the bytes actually present, never with a declared size.

    Args:
        stream: Uncompressed tar bytes.
        url: Shard URL, named in every error.
        seekable: Whether ``stream`` may be seeked to hop over data and jump to offsets.
        offset: Byte offset in the shard where ``stream`` is positioned (a member boundary).
        end: Byte offset where the wanted members end (a member boundary, e.g. from the
            shard's index): reading stops there as if the archive ended. ``None``: read to the
            end-of-archive blocks.
        size: The shard's size in bytes when known (file size, Content-Length), else None.
        max_member_bytes: Largest member whose data is read into memory.
    """

    def __init__(
        self,
        stream: Any,
        url: str,
        seekable: bool = False,
        offset: int = 0,
        end: int | None = None,
        size: int | None = None,
        max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
    ) -> None:
        self.url = url
        self.offset = offset
        self.end = end
        self.last_key = ""
        #: Entries that are not regular files (directories, links), passed over.
        self.skipped_members = 0
        #: File members whose names belong to no sample (see ``keys.split_key``), passed over.
        self.stray_files = 0
        #: The first of either, for messages.
        self.skipped_example: str | None = None
        #: Whether the shard is gzipped (offsets are then positions in the uncompressed tar).
        self.compressed = False
        self.seekable = seekable
        self.max_member_bytes = max_member_bytes
        self._size = size
        self._stream = stream

    @property
    def _limit(self) -> int | None:
        """Where the readable bytes end: the wanted range's end, else the shard's size."""
        return self.end if self.end is not None else self._size

    def seek(self, offset: int) -> bool:
        """Jump to a byte offset (a member boundary); False when the stream cannot seek."""
        if not self.seekable:
            return False
        self._stream.seek(offset)
        self.offset = offset
        return True

    def note_skipped(self, name: str, file: bool = False) -> None:
        """Count a member that belongs to no sample (verify and index report them)."""
        if file:
            self.stray_files += 1
        else:
            self.skipped_members += 1
        if self.skipped_example is None:
            self.skipped_example = name

    def _read_some(self, size: int) -> bytes:
        try:
            data: bytes = self._stream.read(size)
        except (EOFError, zlib.error, gzip.BadGzipFile) as error:
            raise ShardFormatError(
                f"{self.url}: broken gzip stream near uncompressed byte offset {self.offset} "
                f"(after key {self.last_key!r}): {error}. Re-copy or rebuild the shard, or pass "
                "on_error='skip'."
            ) from error
        return data

    def _read(self, size: int, what: str) -> bytes:
        data = self._read_some(size) if size <= _STEP_BYTES else self._read_in_steps(size)
        if len(data) != size:
            raise ShardFormatError(
                f"{self.url}: truncated at byte offset {self.offset + len(data)} while reading "
                f"{what} (after key {self.last_key!r}); expected {size} bytes, found "
                f"{len(data)}. Re-copy or rebuild the shard, or pass on_error='skip'."
            )
        self.offset += size
        return data

    def _read_in_steps(self, size: int) -> bytes:
        parts, left = [], size
        while left:
            part = self._read_some(min(left, _STEP_BYTES))
            parts.append(part)
            left -= len(part)
            if not part:
                break
        return b"".join(parts)

    def _skip(self, size: int, what: str) -> None:
        if size and self.seekable:
            self._stream.seek(size, 1)
            self.offset += size
            return
        while size:  # read and drop, a bounded step at a time
            step = min(size, _STEP_BYTES)
            self._read(step, what)
            size -= step

    def _check_size(self, size: int, kind: bytes, name: str | None, want_data: bool) -> None:
        """Refuse a declared size that memory or the shard's known end cannot hold."""
        what = f"member {name!r}" if name is not None else "a member"
        header_offset = self.offset - BLOCK
        if kind in (b"L", b"x", b"g") and size > MAX_EXTENDED_BYTES:
            raise ShardFormatError(
                f"{self.url}: extended header at byte offset {header_offset} declares {size} "
                f"bytes, more than the {MAX_EXTENDED_BYTES} a real one needs; the shard is "
                "corrupt."
            )
        if self._limit is not None and self.offset + size > self._limit:
            ends = "the shard's index ends this range" if self.end is not None else "the shard ends"
            raise ShardFormatError(
                f"{self.url}: {what} at byte offset {header_offset} declares {size} bytes, but "
                f"{ends} at byte {self._limit}; the header or index is corrupt, or the shard is "
                "truncated. Re-copy or rebuild it, or pass on_error='skip'."
            )
        if want_data and kind in FILE_TYPES and size > self.max_member_bytes:
            raise ShardFormatError(
                f"{self.url}: {what} at byte offset {header_offset} declares {size} bytes, more "
                f"than max_member_bytes={self.max_member_bytes}. If the shard is genuine, raise "
                "StreamOptions(max_member_bytes=...); otherwise it is corrupt."
            )

    def _next_header(self) -> bytes | None:
        """The next 512-byte header block, or None at an end-of-archive (zero) block."""
        header = self._read_some(BLOCK)
        while header and len(header) < BLOCK:  # a stream may return a block in parts
            part = self._read_some(BLOCK - len(header))
            if not part:
                break
            header += part
        if len(header) < BLOCK:
            raise ShardFormatError(
                f"{self.url}: ends at byte offset {self.offset + len(header)} without the tar "
                f"end-of-archive blocks (after key {self.last_key!r}); the shard is truncated. "
                "Re-copy or rebuild it, or pass on_error='skip'."
            )
        self.offset += BLOCK
        return None if header == _ZERO else header

    def next_member(self, want_data: bool = True) -> tuple[str, bytes | None, int] | None:
        """Return ``(name, data, header_offset)`` of the next file member, or None at the end.

        ``data`` is None when ``want_data`` is False (the data is hopped over).

        Raises:
            ShardFormatError: A corrupt header, a size nothing can hold, truncation or a
                broken gzip stream (the message names the shard and byte offset).
        """
        start, name, size_override = self.offset, None, None
        while True:
            if self.end is not None and self.offset >= self.end and name is None:
                return None
            header = self._next_header()
            if header is None:
                return None
            size, kind = check_header(header, self.url, self.offset - BLOCK)
            if kind in (b"L", b"x"):
                self._check_size(size, kind, name, want_data)
                extra = self._read(padded(size), "an extended header")[:size]
                if kind == b"L":
                    name = extra.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                else:
                    where = self.offset - padded(size) - BLOCK
                    name, size_override = parse_pax(extra, self.url, where, name, size_override)
                continue
            size = size if size_override is None else size_override
            name = header_name(header) if name is None else name
            self._check_size(size, kind, name, want_data)
            if kind not in FILE_TYPES:  # links, directories, devices, global headers...
                if kind != b"g":
                    self.note_skipped(name)
                self._skip(padded(size), f"member {name!r}")
                start, name, size_override = self.offset, None, None
                continue
            if not want_data:
                self._skip(padded(size), f"member {name!r}")
                return name, None, start
            # Read exactly the member (no slice copy of the padded block), then hop the padding.
            data = self._read(size, f"member {name!r}")
            self._skip(padded(size) - size, f"member {name!r}")
            return name, data, start


def _is_seekable(stream: Any) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def stream_size(stream: Any) -> int | None:
    """The byte size of a shard stream when it is known: remote size, file size, seekable end."""
    size = getattr(stream, "size", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    try:
        return os.fstat(stream.fileno()).st_size
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        pass
    if not _is_seekable(stream):
        return None
    position = stream.tell()
    end = int(stream.seek(0, io.SEEK_END))
    stream.seek(position)
    return end
