"""Deterministic tar writing: the same members always give the same bytes.

Headers come from :func:`shardstream.format.tarheader.member_header` (mtime 0, uid/gid 0, mode
0o644), so a shard's sha256 depends only on its members. The archive ends with two zero blocks
(``END_BYTES``).
"""

from __future__ import annotations

import hashlib
from typing import IO

from shardstream.format.digests import sample_members_digest
from shardstream.format.keys import key_hash
from shardstream.format.tarheader import BLOCK, member_header

__all__ = ["TarShardWriter"]

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
        #: The key hash of every sample (:func:`~shardstream.format.keys.key_hash`).
        self.key_hashes: list[int] = []
        #: The content digest of every sample (:mod:`~shardstream.format.digests`).
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
