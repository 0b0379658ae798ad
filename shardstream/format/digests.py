"""A sample's content digest: what makes two samples exact duplicates, whatever their keys.

The digest is a 128-bit BLAKE2b over the sample's content members, sorted by extension, each as
its extension, its length and its bytes. Content members are every member but the metadata ones
(``cls``, ``json``, ``txt``: labels, captions, ids and URLs that differ between copies of the
same image); a sample of metadata alone is digested whole. The build and ``shardstream index``
compute it where the bytes pass anyway and store it in the shard's index (version 3, see
:mod:`shardstream.format.shardindex`), so ``shardstream dups`` finds duplicates from indexes
alone. 128 bits keep a false match below one in 10^18 even at 10^10 samples.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["DIGEST_BYTES", "METADATA_EXTENSIONS", "sample_digest", "sample_members_digest"]

DIGEST_BYTES = 16
#: Members left out of the digest: labels, captions and metadata (ids, URLs, sizes).
METADATA_EXTENSIONS = frozenset({"cls", "json", "txt"})


def _is_metadata(extension: str) -> bool:
    return extension.rpartition(".")[2].lower() in METADATA_EXTENSIONS


def sample_members_digest(members: Iterable[tuple[str, bytes | bytearray | memoryview]]) -> bytes:
    """The digest of a sample's ``(extension, data)`` members (any order).

    Examples:
        >>> a = sample_members_digest([("jpg", b"\\xff\\xd8"), ("cls", b"1")])
        >>> a == sample_members_digest([("cls", b"7"), ("jpg", b"\\xff\\xd8")]), len(a)
        (True, 16)
    """
    items = sorted(members, key=lambda item: item[0])
    content = [item for item in items if not _is_metadata(item[0])] or items
    digest = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for extension, data in content:
        digest.update(extension.encode("utf-8") + b"\0" + len(data).to_bytes(8, "little"))
        digest.update(data)
    return digest.digest()


def sample_digest(sample: Mapping[str, Any]) -> bytes:
    """The digest of a sample as the tar reader groups it (``__key__`` and the like left out)."""
    return sample_members_digest(
        (extension, data) for extension, data in sample.items() if not extension.startswith("__")
    )
