"""Deterministic tar writing: the same members always give the same bytes.

Every header has mtime 0, uid/gid 0, empty user and group names and mode 0o644, so a shard's
sha256 depends only on its members. Short ASCII names (the common case) get a plain ustar header
built directly, which is several times faster than ``tarfile.TarInfo.tobuf``; long or non-ASCII
names and huge members fall back to ``tobuf`` in PAX format, so any name is safe. The archive
ends with two zero blocks, which :func:`member_size` callers count through ``END_BYTES``.
"""

from __future__ import annotations

import hashlib
import tarfile
from typing import IO

__all__ = ["BLOCK", "END_BYTES", "TarShardWriter", "member_header", "member_size"]

BLOCK = 512
END_BYTES = 2 * BLOCK
_MAX_USTAR_SIZE = 8**11 - 1
_ZEROS = bytes(BLOCK)
# Fixed fields of every header: mode 0644, uid 0, gid 0, mtime 0 (tarfile's itn format).
_MODE_IDS = b"0000644\0" + b"0000000\0" + b"0000000\0"
_MTIME = b"00000000000\0"
_TAIL = b"0" + bytes(100) + b"ustar\x0000" + bytes(64 + 16 + 155 + 12)


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
    return header + -(-size // BLOCK) * BLOCK


class TarShardWriter:
    """Writes members to a binary stream, hashing and counting every byte.

    Example:
        >>> import io
        >>> writer = TarShardWriter(io.BytesIO())
        >>> writer.start_sample()
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

    def start_sample(self) -> None:
        """Mark that the next member begins a new sample (records its offset for the index)."""
        self.sample_offsets.append(self.num_bytes)

    def write_member(self, name: str, data: bytes) -> None:
        """Append one member (header, data, zero padding)."""
        header = member_header(name, len(data))
        padding = -len(data) % BLOCK
        self._write(header)
        self._write(data)
        if padding:
            self._write(_ZEROS[:padding])

    def finish(self) -> None:
        """Write the two zero blocks that end a tar archive."""
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
