"""Reading one indexed sample fast: a tight parse of its byte range. Torch-free.

:func:`shardstream.streaming.pieces.read_piece` calls this for each sample of a shard with a
byte-offset index and falls back to :class:`~shardstream.streaming.tario.TarReader` whenever it
returns None, so every problem is still reported by the full reader.
"""

from __future__ import annotations

from typing import IO, Any, cast

from shardstream.errors import ShardFormatError
from shardstream.streaming.tarheader import (
    BLOCK,
    MAX_EXTENDED_BYTES,
    check_header,
    header_name,
    padded,
    parse_pax,
)
from shardstream.streaming.tario import FILE_TYPES, MAX_MEMBERS_PER_SAMPLE, Sample, split_key

__all__ = ["read_plain_sample"]


def read_plain_sample(
    stream: IO[bytes], url: str, begin: int, end: int, max_member_bytes: int
) -> Sample | None:
    """The one sample in bytes ``[begin, end)`` of ``stream`` (positioned at ``begin``).

    The fast path for reading by index: file members of one key (ustar, with PAX or GNU
    long-name headers), parsed in one tight loop. Member data are ``bytearray`` read straight
    into (so a raw batch without workers wraps them as tensors, no copy). Anything else (other
    member types, a second key, a bad header, a short read) returns None, with the stream
    anywhere in the range; the caller then seeks back and reads the range with
    :class:`TarReader`, which handles it or reports it.
    """
    read, readinto = stream.read, cast(Any, stream).readinto
    sample: Sample | None = None
    position, name, size_override = begin, None, None
    while position < end:
        header = read(BLOCK)
        if len(header) != BLOCK:
            return None
        try:
            size, kind = check_header(header, url, position)
            stop = position + BLOCK + padded(size)
            if kind in (b"x", b"L"):  # a PAX or GNU long-name header for the next member
                extra = read(padded(size))
                if size > MAX_EXTENDED_BYTES or stop > end or len(extra) != padded(size):
                    return None
                if kind == b"L":
                    name = extra[:size].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                else:
                    name, size_override = parse_pax(
                        extra[:size], url, position, name, size_override
                    )
                position = stop
                continue
        except ShardFormatError:
            return None
        if size_override is not None:
            size, stop = size_override, position + BLOCK + padded(size_override)
        parts = split_key(header_name(header) if name is None else name)
        name = size_override = None
        if kind not in FILE_TYPES or parts is None or stop > end or size > max_member_bytes:
            return None
        data = bytearray(size)
        pad = stop - position - BLOCK - size
        if readinto(data) != size or (pad and len(read(pad)) != pad):
            return None
        key, extension = parts
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
        position = stop
    return sample
