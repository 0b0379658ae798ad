"""Reading tar shards: members, then samples grouped by key. Torch-free.

A hand-written parser instead of :mod:`tarfile`: it reads each header once, understands ustar
prefixes, GNU long names and PAX paths/sizes, transparently gunzips ``.tar.gz``/``.tgz``, can
hop over data it does not need (seeking when the stream allows) and knows the byte offset of
every sample, which is what lets a reader start in the middle of a shard.

Members that are not regular files (directories, links) are hopped over and counted in
:attr:`TarReader.skipped_members`; :mod:`shardstream._format.tarreader` groups the file members
into samples.

Grouping tar members into samples by key (the WebDataset rule). Torch-free.

Members ``dir/name.ext`` with the same key (see :func:`shardstream._format.keys.split_key`) that
sit next to each other form one sample. Members that belong to no sample (directories,
``__MACOSX/`` entries, dotfiles, names without an extension) are skipped and counted on the
reader.

Reading one indexed sample fast: its bytes parsed in one tight loop, the full reader otherwise.

:func:`shardstream.streaming._worker.pieces.open_piece` calls :func:`parse_plain_sample` for each
sample of a shard with a byte-offset index (on bytes storage hands over: a slice of a memory
map, or one read) and falls back to :func:`read_full_sample`, which reads the sample with
:class:`~shardstream._format.tarreader.TarReader`, whenever it returns None, so every problem is
still reported by the full reader. Member data are views of the bytes handed over: nothing is
copied per member. Torch-free."""

from __future__ import annotations

import gzip
import io
import os
import zlib
from collections.abc import Iterator, Sequence
from typing import IO, Any, cast

import numpy as np

from shardstream._format.keys import split_key
from shardstream._format.tarformat import (
    BLOCK,
    FILE_TYPES,
    MAX_EXTENDED_BYTES,
    check_header,
    header_name,
    padded,
    parse_pax,
    usual_header,
)
from shardstream.errors import ShardFormatError

__all__ = [
    "DEFAULT_MAX_MEMBER_BYTES",
    "KEY_READ_BYTES",
    "MAX_MEMBERS_PER_SAMPLE",
    "Sample",
    "TarReader",
    "index_mismatch",
    "is_gzip_name",
    "iter_samples",
    "key_at",
    "open_tar",
    "parse_plain_sample",
    "read_full_sample",
    "read_plain_sample",
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
    def _after_key(self) -> str:
        """`` (after key 'k')`` for messages; nothing before the first key read."""
        return f" (after key {self.last_key!r})" if self.last_key else ""

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
                f"{self.url}: broken gzip stream near uncompressed byte offset {self.offset}"
                f"{self._after_key}: {error}. Re-copy or rebuild the shard, or pass "
                "on_error='skip'."
            ) from error
        return data

    def _read(self, size: int, what: str) -> bytes:
        data = self._read_some(size) if size <= _STEP_BYTES else self._read_in_steps(size)
        if len(data) != size:
            raise ShardFormatError(
                f"{self.url}: truncated at byte offset {self.offset + len(data)} while reading "
                f"{what}{self._after_key}; expected {size} bytes, found "
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
                f"end-of-archive blocks{self._after_key}; the shard is truncated. "
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


#: Members of one sample (key) at most; real samples have a handful.
MAX_MEMBERS_PER_SAMPLE = 1024


def iter_samples(reader: TarReader, want_data: bool = True) -> Iterator[tuple[Sample, int]]:
    """Group contiguous members by key: yields ``(sample, byte_offset_of_sample)``.

    Samples carry ``__key__`` and ``__url__`` plus one entry per member extension (bytes, or
    None when ``want_data`` is False).

    Raises:
        ShardFormatError: Truncation, a corrupt header, or one key holding the same extension
            twice; the message names the shard, key and byte offset.

    Examples:
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
            reader.note_skipped(name, file=True)
            continue
        key, extension = parts
        if current is not None and key == current["__key__"]:
            if extension in current:
                raise ShardFormatError(
                    f"{reader.url}: key {key!r} holds {extension!r} twice (byte offset {offset}); "
                    "each sample may have one member per extension"
                )
            if len(current) > MAX_MEMBERS_PER_SAMPLE:
                raise ShardFormatError(
                    f"{reader.url}: key {key!r} has more than {MAX_MEMBERS_PER_SAMPLE} members "
                    f"(byte offset {offset}); a sample holds a handful. The shard is corrupt."
                )
            current[extension] = data
            continue
        if current is not None:
            yield current, current_offset
        reader.last_key = key
        current, current_offset = {"__key__": key, "__url__": reader.url, extension: data}, offset
    if current is not None:
        yield current, current_offset


#: Bytes read to find a sample's key: its first header, and a long name or pax header before it.
KEY_READ_BYTES = 8192


def key_at(data: bytes, url: str) -> str:
    """The key of the sample whose bytes start ``data`` (at least its first member's headers).

    Examples:
        >>> from shardstream._format.tarformat import member_header
        >>> key_at(member_header("a/b.jpg", 3) + b"abc", "x.tar")
        'a/b'
    """
    reader = TarReader(io.BytesIO(data), url, seekable=True)
    member = reader.next_member(want_data=False)
    parts = split_key(member[0]) if member is not None else None
    if parts is None:
        raise ShardFormatError(f"{url}: no sample starts at this index offset; run verify")
    return parts[0]


def read_plain_sample(
    stream: IO[bytes], url: str, begin: int, end: int, max_member_bytes: int
) -> Sample | None:
    """The one sample in bytes ``[begin, end)`` of ``stream`` (positioned at ``begin``).

    The fast path for reading by index: the whole range is read with one ``readinto`` and its
    file members of one key (ustar, with PAX or GNU long-name headers) are parsed in one tight
    loop. Member data are writable ``memoryview`` slices of that one buffer: no copy per member,
    and a raw batch without workers wraps them as tensors as they are. Anything else (other
    member types, a second key, a bad header, a short read, a range larger than
    ``max_member_bytes``) returns None, with the stream anywhere in the range; the caller then
    seeks back and reads the range with :class:`TarReader`, which handles it or reports it.
    """
    length = end - begin
    if not 0 < length <= max_member_bytes:
        return None
    buffer = np.empty(length, np.uint8)  # not zeroed: readinto fills it
    if cast(Any, stream).readinto(buffer) != length:
        return None
    return parse_plain_sample(memoryview(cast(Any, buffer)), url, begin)


def parse_plain_sample(view: memoryview, url: str, begin: int) -> Sample | None:
    """The one sample in ``view`` (bytes from offset ``begin`` of ``url``), or None.

    Member data are slices of ``view``. None means anything but file members of one key
    (ustar, with PAX or GNU long-name headers) filling ``view`` exactly: read it with
    :class:`TarReader`, which handles it or reports it.
    """
    length = len(view)
    sample: Sample | None = None
    position, name, size_override = 0, None, None
    while position < length:
        start = position + BLOCK
        # The usual header is read from the view in place; any other is copied and parsed.
        parsed = usual_header(view, position) if name is None else None
        if parsed is not None:
            size, kind, member = parsed
            parts = split_key(member)
        else:
            header = bytes(view[position:start])
            if len(header) < BLOCK:  # an index offset off the tar's blocks
                return None
            try:
                size, kind = check_header(header, url, begin + position)
                if kind in (b"x", b"L"):  # a PAX or GNU long-name header for the next member
                    if size > MAX_EXTENDED_BYTES or start + padded(size) > length:
                        return None
                    extra = bytes(view[start : start + size])
                    if kind == b"L":
                        name = extra.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                    else:
                        name, size_override = parse_pax(
                            extra, url, begin + position, name, size_override
                        )
                    position = start + padded(size)
                    continue
            except ShardFormatError:
                return None
            if size_override is not None:
                size = size_override
            parts = split_key(header_name(header) if name is None else name)
            name = size_override = None
        position = start + padded(size)
        if kind not in FILE_TYPES or parts is None or position > length:
            return None
        key, extension = parts
        data = view[start : start + size]
        if sample is None:
            sample = {"__key__": key, "__url__": url, extension: data}
        elif (
            key == sample["__key__"]
            and extension not in sample
            and len(sample) <= MAX_MEMBERS_PER_SAMPLE
        ):
            sample[extension] = data
        else:
            return None
    return sample


def read_full_sample(
    stream: IO[bytes], url: str, ordinal: int, offsets: Sequence[int], limit: int, previous: str
) -> Sample:
    """Sample ``ordinal`` read with the full reader, which handles or reports what it holds.

    Args:
        stream: The shard (any position; seekable over the sample's bytes).
        url: The shard's URL, for samples and messages.
        ordinal: The sample's number in the shard.
        offsets: The shard's index (sample starts, then the end of the last).
        limit: Largest member read into memory.
        previous: The key of the sample before it, which errors name.

    Raises:
        ShardFormatError: The bytes the index gives are not exactly one sample, or are broken.
    """
    here, after = offsets[ordinal], offsets[ordinal + 1]
    stream.seek(here)
    reader = TarReader(stream, url, True, here, after, None, limit)
    reader.last_key = previous
    found = list(iter_samples(reader))
    if len(found) != 1 or found[0][1] != here:
        raise index_mismatch(url, ordinal, offsets, found)
    return found[0][0]


def index_mismatch(
    url: str, ordinal: int, offsets: Sequence[int], found: list[tuple[Sample, int]]
) -> ShardFormatError:
    """The error for an index whose sample ``ordinal`` is not the ``found`` samples' bytes."""
    where = f"bytes {offsets[ordinal]}..{offsets[ordinal + 1]}"
    seen = ", ".join(f"{sample['__key__']!r} at byte {offset}" for sample, offset in found[:3])
    return ShardFormatError(
        f"{url}: its index says sample {ordinal} is {where}, but they hold "
        f"{len(found)} sample(s) ({seen or 'none'}); the shard or its index changed after the "
        "build. Rebuild it or run `shardstream verify`."
    )
