"""Reading one indexed sample fast: one read (or one memory map) of its bytes, then a tight parse.

:func:`shardstream.streaming.worker.pieces.read_piece` calls this for each sample of a shard with a
byte-offset index and falls back to :class:`~shardstream.format.tarreader.TarReader` whenever it
returns None, so every problem is still reported by the full reader. Torch-free.

Local shards are read through :class:`SampleMap`: copy-on-write memory maps of windows of whole
samples. Members are then views of the page cache itself: nothing is copied or zeroed when a
sample is read, and a shuffle buffer of mapped samples holds no private memory (a DataLoader
worker copies a member once, into its shared-memory batch). As with any memory-mapped reader
(Hugging Face ``datasets``, LMDB), a shard file truncated in place while it is mapped makes the
next access of its missing pages fail with SIGBUS: replace shards by renaming (as the writer
does, and ``rsync``), or pass ``StreamOptions(memory_map=False)``.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Sequence
from typing import IO, Any, cast

import numpy as np

from shardstream.errors import ShardFormatError
from shardstream.format.filemaps import map_range
from shardstream.format.keys import split_key
from shardstream.format.samples import MAX_MEMBERS_PER_SAMPLE
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
from shardstream.format.tarreader import Sample

__all__ = [
    "MAP_WINDOW_BYTES",
    "SampleMap",
    "map_range",
    "parse_plain_sample",
    "read_plain_sample",
]

#: Most bytes of a shard mapped at once. A mapping stays until every sample in it is released,
#: so this bounds the shard bytes that one held sample keeps mapped (about 14 JPEGs of 70 KB).
MAP_WINDOW_BYTES = 1 << 20


class SampleMap:
    """Samples of one local shard file as views of copy-on-write memory maps.

    Each mapping covers a window of whole consecutive samples (at most ``window`` bytes, or one
    larger sample) and is unmapped when the last view into it is released. Views are writable
    (copy-on-write: writing changes this process's page, never the file), so ``torch.frombuffer``
    wraps them without a copy or a warning.

    Args:
        stream: An open local file of the shard.
        offsets: The shard's index: where each sample starts, then where the last one ends.
        stop: One past the last sample that will be asked for.
        window: Most bytes mapped at once.

    Example:
        >>> with open("shard-000000.tar", "rb") as stream:  # doctest: +SKIP
        ...     view = SampleMap(stream, offsets, 8).view(3)  # bytes of sample 3, or None
    """

    def __init__(
        self, stream: IO[bytes], offsets: Sequence[int], stop: int, window: int = MAP_WINDOW_BYTES
    ) -> None:
        self._offsets, self._stop, self._window = offsets, stop, window
        self._view: memoryview | None = None
        self._base = self._end = 0
        try:
            self._fileno = stream.fileno()
            # Mapping bytes past the end of the file would fault: a shorter file is read (and
            # reported) by the caller instead.
            self.usable = os.fstat(self._fileno).st_size >= offsets[stop]
        except (OSError, ValueError):  # no file descriptor (io.UnsupportedOperation is both)
            self.usable = False

    def view(self, ordinal: int) -> memoryview | None:
        """The bytes of sample ``ordinal``, or None when they cannot be mapped (read them)."""
        here, after = self._offsets[ordinal], self._offsets[ordinal + 1]
        view = self._view
        if view is None or here < self._base or after > self._end:
            if not self.usable or after <= here:
                return None
            view = self._map(ordinal)
            if view is None:
                return None
        return view[here - self._base : after - self._base]

    def _map(self, ordinal: int) -> memoryview | None:
        offsets = self._offsets
        base = offsets[ordinal] - offsets[ordinal] % mmap.ALLOCATIONGRANULARITY
        last = ordinal + 1
        while last < self._stop and offsets[last + 1] - base <= self._window:
            last += 1
        view = map_range(self._fileno, base, offsets[last])
        if view is None:  # out of maps or descriptors: read from now on
            self.usable, self._view = False, None
            return None
        self._view, self._base, self._end = view, base, offsets[last]
        return self._view


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
