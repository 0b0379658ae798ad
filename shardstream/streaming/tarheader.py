"""Parsing tar header blocks and PAX records, strictly. Torch-free.

Every field of a shard may be broken or hostile, so nothing here trusts a byte: numbers must be
well-formed octal (or GNU base-256) or decimal, PAX records must be length-prefixed and end
where their length says, and every failure is a :class:`ShardFormatError` that names the shard,
the byte offset and what was wrong. No loop here can run without consuming input, so a
malformed record can never make a reader spin.
"""

from __future__ import annotations

import zlib

from shardstream.errors import ShardFormatError

__all__ = ["BLOCK", "MAX_EXTENDED_BYTES", "check_header", "header_name", "padded", "parse_pax"]

BLOCK = 512
#: Largest GNU long name or PAX extended header believed (real ones are a few hundred bytes).
MAX_EXTENDED_BYTES = 1 << 20
_PAX_LENGTH_DIGITS = 20
_HALVES = bytes(value >> 1 for value in range(256))
_ADLER_MOD = 65521
_OCTAL = b"01234567"


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


def byte_sum(block: bytes) -> int:
    """``sum(block)`` of a 512-byte block, exactly, in C: about 3x faster than ``sum``.

    zlib's Adler-32 low half is ``(1 + sum) mod 65521``; the sum of the halved bytes
    (``b >> 1``, at most 512 * 127 < 65521) is exact. The full sum is twice that plus the count
    of odd bytes (0..512), which the first congruence fixes uniquely.
    """
    low = zlib.adler32(block) & 0xFFFF
    half = (zlib.adler32(block.translate(_HALVES)) & 0xFFFF) - 1
    return 2 * half + (low - 1 - 2 * half) % _ADLER_MOD


def header_name(header: bytes) -> str:
    """The member name of a header block, with the ustar prefix when there is one."""
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


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
