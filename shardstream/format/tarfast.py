"""Reading one indexed sample fast: its bytes parsed in one tight loop, the full reader otherwise.

:func:`shardstream.streaming.worker.pieces.open_piece` calls :func:`parse_plain_sample` for each
sample of a shard with a byte-offset index (on bytes storage hands over: a slice of a memory
map, or one read) and falls back to :func:`read_full_sample`, which reads the sample with
:class:`~shardstream.format.tarreader.TarReader`, whenever it returns None, so every problem is
still reported by the full reader. Member data are views of the bytes handed over: nothing is
copied per member. Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import IO, Any, cast

import numpy as np

from shardstream.errors import ShardFormatError
from shardstream.format.keys import split_key
from shardstream.format.samples import MAX_MEMBERS_PER_SAMPLE, iter_samples
from shardstream.format.tarheader import (
    BLOCK,
    FILE_TYPES,
    MAX_EXTENDED_BYTES,
    check_header,
    header_name,
    padded,
    parse_pax,
    usual_header,
)
from shardstream.format.tarreader import Sample, TarReader

__all__ = ["index_mismatch", "parse_plain_sample", "read_full_sample", "read_plain_sample"]


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
        header = bytes(view[position : position + BLOCK])
        start = position + BLOCK
        parsed = usual_header(header) if name is None else None
        if parsed is not None:
            size, kind, member = parsed
            parts = split_key(member)
        else:
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
