"""Tar header blocks both ways: strict parsing for readers, deterministic building for writers.

Parsing: every field of a shard may be broken or hostile, so nothing here trusts a byte:
numbers must be well-formed octal (or GNU base-256) or decimal, PAX records must be
length-prefixed and end where their length says, and every failure is a
:class:`ShardFormatError` that names the shard, the byte offset and what was wrong. No loop here
can run without consuming input, so a malformed record can never make a reader spin.

Building: every header has mtime 0, uid/gid 0, empty user and group names and mode 0o644, so a
shard's bytes depend only on its members. Short ASCII names (the common case) get a plain ustar
header built directly, several times faster than ``tarfile.TarInfo.tobuf``; long or non-ASCII
names and huge members fall back to ``tobuf`` in PAX format, so any name is safe.

Deterministic tar writing: the same members always give the same bytes.

Headers come from :func:`shardstream._format.tarformat.member_header` (mtime 0, uid/gid 0, mode
0o644), so a shard's sha256 depends only on its members. The archive ends with two zero blocks
(``END_BYTES``)."""

from __future__ import annotations

import hashlib
import struct
import tarfile
import zlib
from typing import IO

from shardstream._format.keys import key_hash, sample_members_digest
from shardstream.errors import ShardFormatError

__all__ = [
    "BLOCK",
    "END_BYTES",
    "FILE_TYPES",
    "MAX_EXTENDED_BYTES",
    "TarShardWriter",
    "byte_sum",
    "check_header",
    "header_name",
    "member_header",
    "member_size",
    "padded",
    "parse_pax",
    "usual_header",
]


BLOCK = 512
#: Type flags of regular files (and contiguous files, read as regular ones).
FILE_TYPES = (b"0", b"\0", b"7")
#: The two zero blocks that end a tar archive.
END_BYTES = 2 * BLOCK
#: Largest GNU long name or PAX extended header believed (real ones are a few hundred bytes).
MAX_EXTENDED_BYTES = 1 << 20
_PAX_LENGTH_DIGITS = 20
#: Bytes summed exactly by one Adler-32: 256 * 255 stays below its modulus, 65521.
_SUM_BYTES = 256
_OCTAL = b"01234567"
_MAX_USTAR_SIZE = 8**11 - 1
# Fixed fields of every header built here: mode 0644, uid 0, gid 0, mtime 0 (tarfile's format).
_MODE_IDS = b"0000644\0" + b"0000000\0" + b"0000000\0"
_MTIME = b"00000000000\0"
_TAIL = b"0" + bytes(100) + b"ustar\x0000" + bytes(64 + 16 + 155 + 12)


def padded(size: int) -> int:
    """``size`` rounded up to whole 512-byte blocks."""
    return (size + BLOCK - 1) // BLOCK * BLOCK


def check_header(header: bytes, url: str, offset: int) -> tuple[int, bytes]:
    """Validate a 512-byte header block; return ``(member size, type flag)``.

    Raises:
        ShardFormatError: Bad checksum (not a tar header) or a malformed size field.
    """
    field = header[148:156]
    stored = field.split(b"\0", 1)[0].strip()
    expected = byte_sum(header) - sum(field) + 8 * 32
    if not stored or stored.strip(_OCTAL) or int(stored, 8) != expected:
        raise ShardFormatError(
            f"{url}: no valid tar header at byte offset {offset} (bad checksum); expected a tar "
            "(optionally gzipped) archive. The shard is corrupt or not a tar file."
        )
    raw_size = header[124:136]
    if raw_size[0] == 0x80:  # GNU base-256 for sizes >= 8 GiB (0xff would be negative)
        return int.from_bytes(raw_size[1:], "big"), header[156:157]
    digits = raw_size.split(b"\0", 1)[0].strip()
    if digits.strip(_OCTAL):
        raise ShardFormatError(
            f"{url}: tar header at byte offset {offset} has a malformed size field {raw_size!r} "
            "(expected octal digits); the shard is corrupt."
        )
    return int(digits or b"0", 8), header[156:157]


def byte_sum(block: bytes | memoryview, position: int = 0) -> int:
    """``sum`` of the 512-byte block at ``position`` of ``block``, exactly, in C (no copy of a
    ``memoryview``): several times faster than ``sum``.

    zlib's Adler-32 low half is ``(1 + sum) mod 65521``, exact for 256 bytes (at most
    ``256 * 255 = 65280``): one Adler-32 per half block.
    """
    middle, end = position + _SUM_BYTES, position + BLOCK
    low = zlib.adler32(block[position:middle]) & 0xFFFF
    return low + (zlib.adler32(block[middle:end]) & 0xFFFF) - 2


def header_name(header: bytes) -> str:
    """The member name of a header block, with the ustar prefix when there is one."""
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


#: The usual header's fields read in one call: name, size digits and the NUL after them,
#: checksum, type flag, and the first byte of the ustar prefix (mode, ids, mtime, link name,
#: magic, owner names and device numbers are passed over, as the careful parse does).
_USUAL_FIELDS = struct.Struct("100s24x11sc12x8sc188xc")


def usual_header(header: bytes | memoryview, position: int = 0) -> tuple[int, bytes, str] | None:
    """``(size, type flag, name)`` of the usual header block at ``position`` of ``header``, or
    None for anything else.

    The usual header is the one Python's ``tarfile``, GNU tar and this library write for a
    regular file with a short name: checksum as six octal digits, NUL, space; size as eleven
    octal digits and a NUL; no ustar prefix. Its fields are read at fixed places (from a
    ``memoryview`` of a shard without copying the block), with the same checksum check as
    :func:`check_header`, in about half the time. Any other header (a bad checksum included,
    or fewer than 512 bytes) returns None: parse it with :func:`check_header` and
    :func:`header_name`, which accept or report it.
    """
    if len(header) - position < BLOCK:
        return None
    name, digits, size_end, field, kind, prefix = _USUAL_FIELDS.unpack_from(header, position)
    if (
        field[6:] != b"\0 "
        or size_end != b"\0"
        or prefix != b"\0"
        or kind not in FILE_TYPES
        or field[:6].strip(_OCTAL)
        or digits.strip(_OCTAL)
    ):
        return None
    if int(field[:6], 8) != byte_sum(header, position) - sum(field) + 8 * 32:
        return None
    end = name.find(0)
    return (
        int(digits, 8),
        kind,
        (name if end < 0 else name[:end]).decode("utf-8", "surrogateescape"),
    )


def parse_pax(
    data: bytes, url: str, offset: int, name: str | None, size: int | None
) -> tuple[str | None, int | None]:
    """Apply PAX records ``"<length> <key>=<value>\\n"`` to ``(name, size)``.

    Only ``path`` and ``size`` matter to a reader; other keys are checked for shape and ignored.

    Raises:
        ShardFormatError: A record without a valid length, running past the header, not ending
            in a newline, or a ``size`` that is not a decimal number.
    """
    position = 0
    while position < len(data):
        if not data[position:].strip(b"\0"):
            break  # trailing NUL padding some writers leave
        space = data.find(b" ", position, position + _PAX_LENGTH_DIGITS + 1)
        digits = data[position:space] if space > position else b""
        length = int(digits) if digits.isdigit() else 0
        end = position + length
        if length <= len(digits) + 1 or end > len(data) or data[end - 1 : end] != b"\n":
            raise _pax_error(url, offset, position, "a record without a valid length prefix")
        key, equals, value = data[space + 1 : end - 1].partition(b"=")
        if not equals:
            raise _pax_error(url, offset, position, f"record {key[:40]!r} has no '='")
        if key == b"path":
            name = value.decode("utf-8", "surrogateescape")
        elif key == b"size":
            if not value.isdigit():
                raise _pax_error(url, offset, position, f"size {value[:40]!r} is not a number")
            size = int(value)
        position = end
    return name, size


def _pax_error(url: str, offset: int, position: int, what: str) -> ShardFormatError:
    return ShardFormatError(
        f"{url}: malformed PAX extended header at byte offset {offset} (record at byte "
        f"{position} of the header): {what}; expected '<length> <key>=<value>\\n' records. "
        "The shard is corrupt."
    )


def member_header(name: str, size: int) -> bytes:
    """The header block(s) of a regular-file member ``name`` of ``size`` bytes."""
    if len(name) <= 100 and name.isascii() and size <= _MAX_USTAR_SIZE:
        header = bytearray(
            name.encode("ascii").ljust(100, b"\0")
            + _MODE_IDS
            + b"%011o\0" % size
            + _MTIME
            + b"        "
            + _TAIL
        )
        checksum = sum(header)
        header[148:155] = b"%06o\0" % checksum
        return bytes(header)
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode, info.uid, info.gid = size, 0, 0o644, 0, 0
    info.uname = info.gname = ""
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def member_size(name: str, size: int) -> int:
    """Bytes a member takes in a tar: header(s), data and padding to a block boundary."""
    header = BLOCK if len(name) <= 100 and name.isascii() else len(member_header(name, size))
    return header + padded(size)


_ZEROS = bytes(BLOCK)


class TarShardWriter:
    """Writes members to a binary stream, hashing and counting every byte.

    Examples:
        >>> import io
        >>> writer = TarShardWriter(io.BytesIO())
        >>> writer.start_sample("a/b")
        >>> writer.write_member("a/b.cls", b"3")
        >>> writer.finish()
        >>> writer.num_bytes, writer.sample_offsets
        (2048, [0, 1024])
    """

    def __init__(self, stream: IO[bytes]) -> None:
        self._stream = stream
        self._hash = hashlib.sha256()
        self.num_bytes = 0
        #: Byte offset of every sample's first header, then of the end-of-archive blocks.
        self.sample_offsets: list[int] = []
        #: The key hash of every sample (:func:`~shardstream._format.keys.key_hash`).
        self.key_hashes: list[int] = []
        #: The content digest of every sample (:mod:`~shardstream._format.keys`).
        self.digests: list[bytes] = []
        self._key = ""
        self._members: list[tuple[str, bytes]] = []  # the sample being written, for its digest

    def start_sample(self, key: str) -> None:
        """Mark that the next member begins sample ``key`` (its offset and key go to the index)."""
        self._digest_sample()
        self.sample_offsets.append(self.num_bytes)
        self.key_hashes.append(key_hash(key))
        self._key = key

    def _digest_sample(self) -> None:
        if len(self.digests) < len(self.key_hashes):
            self.digests.append(sample_members_digest(self._members))
        self._members = []

    def write_member(self, name: str, data: bytes) -> None:
        """Append one member (header, data, zero padding)."""
        if self.key_hashes and name.startswith(self._key + "."):
            self._members.append((name[len(self._key) + 1 :], data))
        header = member_header(name, len(data))
        padding = -len(data) % BLOCK
        self._write(header)
        self._write(data)
        if padding:
            self._write(_ZEROS[:padding])

    def finish(self) -> None:
        """Write the two zero blocks that end a tar archive."""
        self._digest_sample()
        self.sample_offsets.append(self.num_bytes)
        self._write(_ZEROS + _ZEROS)

    @property
    def sha256(self) -> str:
        """Hex sha256 of everything written so far."""
        return self._hash.hexdigest()

    def _write(self, data: bytes) -> None:
        self._stream.write(data)
        self._hash.update(data)
        self.num_bytes += len(data)
