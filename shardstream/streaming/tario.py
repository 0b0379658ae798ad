"""Reading tar shards: members, then samples grouped by key. Torch-free.

A hand-written parser instead of :mod:`tarfile`: it reads each header once, understands ustar
prefixes, GNU long names and PAX paths/sizes, transparently gunzips ``.tar.gz``/``.tgz``, can
hop over data it does not need (seeking when the stream allows) and knows the byte offset of
every sample, which is what lets a reader start in the middle of a shard.

Samples follow the WebDataset rule: members ``dir/name.ext`` with the same key (the path up to
the first ``.`` of the basename) that sit next to each other form one sample. Directory entries,
``__MACOSX/`` members, dotfiles and names without an extension are skipped.
"""

from __future__ import annotations

import gzip
from collections.abc import Iterator
from typing import IO, Any, cast

from shardstream.errors import ShardFormatError

__all__ = ["Sample", "TarReader", "is_gzip_name", "iter_samples", "open_tar", "split_key"]

Sample = dict[str, Any]
_BLOCK = 512
_ZERO = bytes(_BLOCK)
_FILE_TYPES = (b"0", b"\0", b"7")
_SKIP_TYPES = (b"1", b"2", b"3", b"4", b"5", b"6", b"g", b"K", b"V")


def split_key(name: str) -> tuple[str, str] | None:
    """``"a/b/x.seg.png"`` -> ``("a/b/x", "seg.png")``; ``None`` for names that are not members."""
    slash = name.rfind("/")
    base = name[slash + 1 :]
    if not base or base.startswith(".") or name.startswith("__MACOSX"):
        return None
    dot = base.find(".")
    if dot <= 0 or dot == len(base) - 1:
        return None
    return name[: slash + 1 + dot], base[dot + 1 :]


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


def open_tar(stream: IO[bytes], url: str) -> TarReader:
    """Wrap a byte stream at offset 0 as a :class:`TarReader`, gunzipping gzip data.

    Gzip is recognised by its magic bytes (read from the same stream, so no extra request).
    """
    head = stream.read(2)
    if head == b"\x1f\x8b":
        gunzipped = gzip.GzipFile(fileobj=cast(IO[bytes], _Prepend(head, stream)), mode="rb")
        return TarReader(gunzipped, url)
    if _is_seekable(stream):
        stream.seek(0)
        return TarReader(stream, url, seekable=True)
    return TarReader(_Prepend(head, stream), url)


class TarReader:
    """Sequential reader of tar members with byte offsets; can hop over member data.

    Args:
        stream: Uncompressed tar bytes.
        url: Shard URL, named in every error.
        seekable: Whether ``stream`` may be seeked to hop over data and jump to offsets.
        offset: Byte offset in the shard where ``stream`` is positioned (a member boundary).
        end: Byte offset where the wanted members end (a member boundary, e.g. from the
            shard's index): reading stops there as if the archive ended. ``None``: read to the
            end-of-archive blocks.
    """

    def __init__(
        self,
        stream: Any,
        url: str,
        seekable: bool = False,
        offset: int = 0,
        end: int | None = None,
    ) -> None:
        self.url = url
        self.offset = offset
        self.end = end
        self.last_key = ""
        self.seekable = seekable
        self._stream = stream

    def seek(self, offset: int) -> bool:
        """Jump to a byte offset (a member boundary); False when the stream cannot seek."""
        if not self.seekable:
            return False
        self._stream.seek(offset)
        self.offset = offset
        return True

    def _read(self, size: int, what: str) -> bytes:
        data = self._stream.read(size)
        if len(data) != size:
            raise ShardFormatError(
                f"{self.url}: truncated at byte offset {self.offset + len(data)} while reading "
                f"{what} (after key {self.last_key!r}); expected {size} bytes, found "
                f"{len(data)}. Re-copy or rebuild the shard, or pass on_error='skip'."
            )
        self.offset += size
        return data

    def _skip(self, size: int, what: str) -> None:
        if size and self.seekable:
            self._stream.seek(size, 1)
            self.offset += size
        elif size:
            self._read(size, what)

    def next_member(self, want_data: bool = True) -> tuple[str, bytes | None, int] | None:
        """Return ``(name, data, header_offset)`` of the next file member, or None at the end.

        ``data`` is None when ``want_data`` is False (the data is hopped over).
        """
        start, name, size_override = self.offset, None, None
        while True:
            if self.end is not None and self.offset >= self.end and name is None:
                return None
            header = self._stream.read(_BLOCK)
            if not header:
                raise ShardFormatError(
                    f"{self.url}: ends at byte offset {self.offset} without the tar end-of-archive "
                    f"blocks (after key {self.last_key!r}); the shard is truncated. Re-copy or "
                    "rebuild it, or pass on_error='skip'."
                )
            if len(header) < _BLOCK:
                self.offset += len(header)
                self._read(_BLOCK - len(header), "a member header")
            self.offset += _BLOCK
            if header == _ZERO:
                return None
            size, kind = _check_header(header, self.url, self.offset - _BLOCK)
            padded = (size + _BLOCK - 1) // _BLOCK * _BLOCK
            if kind in (b"L", b"x"):
                extra = self._read(padded, "an extended header")[:size]
                if kind == b"L":
                    name = extra.rstrip(b"\0").decode("utf-8", "surrogateescape")
                else:
                    name, size_override = _parse_pax(extra, name, size_override)
                continue
            if size_override is not None:
                size = size_override
                padded = (size + _BLOCK - 1) // _BLOCK * _BLOCK
            if name is None:
                name = _header_name(header)
            if kind in _SKIP_TYPES or kind not in _FILE_TYPES:
                self._skip(padded, f"member {name!r}")
                start, name, size_override = self.offset, None, None
                continue
            if not want_data:
                self._skip(padded, f"member {name!r}")
                return name, None, start
            # Read exactly the member (no slice copy of the padded block), then hop the padding.
            data = self._read(size, f"member {name!r}")
            self._skip(padded - size, f"member {name!r}")
            return name, data, start


def _is_seekable(stream: Any) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, OSError, ValueError):
        return False


def _check_header(header: bytes, url: str, offset: int) -> tuple[int, bytes]:
    stored = header[148:156].split(b"\0", 1)[0].strip()
    expected = sum(header) - sum(header[148:156]) + 8 * 32
    try:
        valid = stored != b"" and int(stored, 8) == expected
    except ValueError:
        valid = False
    if not valid:
        raise ShardFormatError(
            f"{url}: no valid tar header at byte offset {offset} (bad checksum); expected a tar "
            "(optionally gzipped) archive. The shard is corrupt or not a tar file."
        )
    raw_size = header[124:136]
    if raw_size[0] & 0x80:  # GNU base-256 for sizes >= 8 GiB
        size = int.from_bytes(raw_size[1:], "big")
    else:
        size = int(raw_size.split(b"\0", 1)[0].strip() or b"0", 8)
    return size, header[156:157]


def _header_name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _parse_pax(data: bytes, name: str | None, size: int | None) -> tuple[str | None, int | None]:
    position = 0
    while position < len(data):
        space = data.find(b" ", position)
        if space < 0:
            break
        length = int(data[position:space])
        key, _, value = data[space + 1 : position + length - 1].partition(b"=")
        if key == b"path":
            name = value.decode("utf-8", "surrogateescape")
        elif key == b"size":
            size = int(value)
        position += length
    return name, size


def iter_samples(reader: TarReader, want_data: bool = True) -> Iterator[tuple[Sample, int]]:
    """Group contiguous members by key: yields ``(sample, byte_offset_of_sample)``.

    Samples carry ``__key__`` and ``__url__`` plus one entry per member extension (bytes, or
    None when ``want_data`` is False).

    Raises:
        ShardFormatError: Truncation, a corrupt header, or one key holding the same extension
            twice; the message names the shard, key and byte offset.

    Example:
        >>> with open("shard-000000.tar", "rb") as f:  # doctest: +SKIP
        ...     keys = [s["__key__"] for s, _ in iter_samples(open_tar(f, "shard-000000.tar"))]
    """
    current: Sample | None = None
    current_offset = 0
    while True:
        member = reader.next_member(want_data)
        if member is None:
            break
        name, data, offset = member
        parts = split_key(name)
        if parts is None:
            continue
        key, extension = parts
        if current is not None and key == current["__key__"]:
            if extension in current:
                raise ShardFormatError(
                    f"{reader.url}: key {key!r} holds {extension!r} twice (byte offset {offset}); "
                    "each sample may have one member per extension"
                )
            current[extension] = data
            continue
        if current is not None:
            yield current, current_offset
        reader.last_key = key
        current, current_offset = {"__key__": key, "__url__": reader.url, extension: data}, offset
    if current is not None:
        yield current, current_offset
