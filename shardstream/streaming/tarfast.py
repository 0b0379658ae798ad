"""Reading one indexed sample fast: one read of its byte range, then a tight parse. Torch-free.

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
    buffer = bytearray(length)
    if cast(Any, stream).readinto(buffer) != length:
        return None
    view = memoryview(buffer)
    sample: Sample | None = None
    position, name, size_override = 0, None, None
    while position < length:
        header = bytes(view[position : position + BLOCK])
        start = position + BLOCK
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
