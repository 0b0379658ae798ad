"""Grouping tar members into samples by key (the WebDataset rule). Torch-free.

Members ``dir/name.ext`` with the same key (see :func:`shardstream.format.keys.split_key`) that
sit next to each other form one sample. Members that belong to no sample (directories,
``__MACOSX/`` entries, dotfiles, names without an extension) are skipped and counted on the
reader.
"""

from __future__ import annotations

import io
from collections.abc import Iterator

from shardstream.errors import ShardFormatError
from shardstream.format.keys import split_key
from shardstream.format.tarreader import Sample, TarReader

__all__ = ["KEY_READ_BYTES", "MAX_MEMBERS_PER_SAMPLE", "iter_samples", "key_at"]

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
        >>> from shardstream.format.tarheader import member_header
        >>> key_at(member_header("a/b.jpg", 3) + b"abc", "x.tar")
        'a/b'
    """
    reader = TarReader(io.BytesIO(data), url, seekable=True)
    member = reader.next_member(want_data=False)
    parts = split_key(member[0]) if member is not None else None
    if parts is None:
        raise ShardFormatError(f"{url}: no sample starts at this index offset; run verify")
    return parts[0]
