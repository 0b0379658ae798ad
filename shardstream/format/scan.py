"""Reading a whole shard once with the real reader: counts, offsets, checksum, problems.

``shardstream verify`` compares a scan with the manifest and the shard's index; indexing shards
made by other tools (``shardstream index``) writes a scan's offsets and counts. Both therefore
group members into samples exactly as the streaming reader does (:mod:`shardstream.format.keys`).
Memory per scan is the index (8 bytes per sample) plus 8 bytes per key for the check that no
key comes back after other keys: bounded by the shard, not by the dataset.
"""

from __future__ import annotations

import array
import dataclasses
import hashlib
import re
from typing import IO, Any

from shardstream.errors import ShardFormatError
from shardstream.format.digests import sample_digest
from shardstream.format.keys import key_hash
from shardstream.format.samples import iter_samples
from shardstream.format.tarheader import BLOCK
from shardstream.format.tarreader import DEFAULT_MAX_MEMBER_BYTES, open_tar, stream_size

__all__ = ["ShardScan", "scan_shard", "without_skip_hint"]


@dataclasses.dataclass
class ShardScan:
    """What one pass over a shard found.

    Attributes:
        num_samples: Samples (groups of adjacent members with one key).
        num_bytes: Bytes of the shard file (compressed bytes for ``.tar.gz``).
        sha256: Hex sha256 of the shard's bytes, or None when not computed.
        offsets: Byte offset of every sample, then where the last one ends (the index), or
            None for a gzipped shard (its offsets cannot be read by byte range).
        key_hashes: The key hash of every sample (see :func:`~shardstream.format.keys.key_hash`).
        digests: The content digest of every sample (16 bytes each, see
            :mod:`~shardstream.format.digests`), or None when the scan hopped over member data.
        first_key: Key of the first sample ("" when there is none).
        last_key: Key of the last sample.
        skipped_members: Entries that are not files (directories, links), passed over.
        stray_files: File members whose names belong to no sample (no extension, dotfiles,
            ``__MACOSX/``...): other readers may read these otherwise.
        skipped_example: The first of either's name.
        problems: What makes the shard unusable or inexact: a tar error, a key that comes
            back after other keys (one sample split in two), one message each.
    """

    num_samples: int = 0
    num_bytes: int = 0
    sha256: str | None = None
    offsets: array.array[int] | None = None
    key_hashes: list[int] = dataclasses.field(default_factory=list)
    digests: bytes | None = None
    first_key: str = ""
    last_key: str = ""
    skipped_members: int = 0
    stray_files: int = 0
    skipped_example: str | None = None
    problems: list[str] = dataclasses.field(default_factory=list)


class _CountingStream:
    """Reads through to ``stream``, counting (and hashing) every byte; never seeks."""

    def __init__(self, stream: IO[bytes], checksum: bool) -> None:
        self._stream = stream
        self.hash = hashlib.sha256() if checksum else None
        self.num_bytes = 0

    def read(self, size: int = -1) -> bytes:
        data: bytes = self._stream.read(size)
        if self.hash is not None:
            self.hash.update(data)
        self.num_bytes += len(data)
        return data

    def drain(self) -> None:
        while self.read(1 << 20):
            pass


def scan_shard(
    stream: IO[bytes],
    url: str,
    checksum: bool = True,
    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES,
) -> ShardScan:
    """Read the shard in ``stream`` (at byte 0) to its end and describe it.

    With ``checksum`` every byte is read and hashed, and every sample's content digested;
    without, a seekable (local) stream hops over member data, which reads only the headers.

    Args:
        stream: The shard's bytes.
        url: Named in problems.
        checksum: Compute the sha256 (reads every byte).
        max_member_bytes: Largest member the scan accepts (data is never held, but a header
            declaring more is reported as corrupt, as the streaming reader would).

    Examples:
        >>> with open("shard-000000.tar", "rb") as f:  # doctest: +SKIP
        ...     scan = scan_shard(f, "shard-000000.tar")
    """
    counting = _CountingStream(stream, checksum)
    hop = not checksum and _seekable(stream)
    reader = open_tar(stream if hop else counting, url, max_member_bytes)  # type: ignore[arg-type]
    scan = ShardScan()
    offsets: list[int] = []
    seen: set[int] = set()
    digests = bytearray()
    complete = False
    try:
        for sample, offset in iter_samples(reader, want_data=not hop):
            if not hop:
                digests += sample_digest(sample)
            key = sample["__key__"]
            hashed = key_hash(key)
            if hashed in seen:
                scan.problems.append(
                    f"{url}: key {key!r} comes back at byte offset {offset} after other keys; "
                    "its members must be adjacent (readers would see two samples)"
                )
            seen.add(hashed)
            scan.key_hashes.append(hashed)
            offsets.append(offset)
            scan.first_key = scan.first_key or key
            scan.last_key = key
        offsets.append(reader.offset - BLOCK)  # where the end-of-archive blocks start
        complete = True
    except ShardFormatError as error:
        scan.problems.append(without_skip_hint(str(error)))
    if not hop:
        counting.drain()
    scan.num_samples = len(offsets) - 1 if complete else len(offsets)
    scan.num_bytes = (stream_size(stream) or 0) if hop else counting.num_bytes
    scan.sha256 = counting.hash.hexdigest() if counting.hash is not None else None
    if complete and not reader.compressed:
        scan.offsets = array.array("Q", offsets)
        scan.digests = None if hop else bytes(digests)
    scan.skipped_members, scan.stray_files = reader.skipped_members, reader.stray_files
    scan.skipped_example = reader.skipped_example
    return scan


def _seekable(stream: Any) -> bool:
    try:
        return bool(stream.seekable())
    except (AttributeError, OSError, ValueError):
        return False


_SKIP_HINT = re.compile(r",? or pass on_error='skip'(?: to skip and count [\w ]+)?")


def without_skip_hint(message: str) -> str:
    """A reader's message without its ``on_error='skip'`` hint, for the commands that read
    every shard to check it (``index``, ``verify``), which have no such option.

    Examples:
        >>> without_skip_hint("x.tar: truncated. Re-copy or rebuild it, or pass on_error='skip'.")
        'x.tar: truncated. Re-copy or rebuild it.'
    """
    return _SKIP_HINT.sub("", message)
