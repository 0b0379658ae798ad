"""The one key rule: how tar member names group into samples, for every reader and writer.

WebDataset readers (this one, ``webdataset``, timm, Hugging Face ``datasets``) group adjacent
members ``dir/name.ext`` by *key*: the path up to the first ``.`` of the base name. So
``a/b/x.seg.png`` is member ``seg.png`` of sample ``a/b/x``. Names that are not sample members
are skipped: directories, names without an extension (``x``, ``x.``), dotfiles (``.x.jpg``) and
macOS resource forks (``__MACOSX/...``).

:func:`split_key` is that rule; the reader, :mod:`~shardstream._format.verify` and the writer
all use it, and the writer refuses any key or extension that would not read back as written
(:func:`member_name`).

A sample's content digest: what makes two samples exact duplicates, whatever their keys.

The digest is a 128-bit BLAKE2b over the sample's content members, sorted by extension, each as
its extension, its length and its bytes. Content members are every member but the metadata ones
(``cls``, ``json``, ``txt``: labels, captions, ids and URLs that differ between copies of the
same image); a sample of metadata alone is digested whole. The build and ``shardstream index``
compute it where the bytes pass anyway and store it in the shard's index (version 3, see
:mod:`shardstream._format.shardindex`), so ``shardstream dups`` finds duplicates from indexes
alone. 128 bits keep a false match below one in 10^18 even at 10^10 samples."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from typing import Any

from shardstream.errors import SourceError

__all__ = [
    "DIGEST_BYTES",
    "METADATA_EXTENSIONS",
    "check_key",
    "check_key_stem",
    "key_hash",
    "member_name",
    "sample_digest",
    "sample_members_digest",
    "split_key",
]


def split_key(name: str) -> tuple[str, str] | None:
    """``"a/b/x.seg.png"`` -> ``("a/b/x", "seg.png")``; ``None`` for names that are not members.

    Examples:
        >>> split_key("a/b/x.seg.png"), split_key("x."), split_key("__MACOSX/._x.jpg")
        (('a/b/x', 'seg.png'), None, None)
    """
    slash = name.rfind("/")
    base = name[slash + 1 :]
    if not base or base.startswith(".") or name.startswith("__MACOSX"):
        return None
    dot = base.find(".")
    if dot <= 0 or dot == len(base) - 1:
        return None
    return name[: slash + 1 + dot], base[dot + 1 :]


def check_key_stem(stem: str, where: str) -> None:
    """Refuse a key whose last path component contains a dot.

    Readers split a member name into key and extension at the first dot of its base name, so
    ``img.v2.jpg`` would be read back as key ``img`` with extension ``v2.jpg``.
    """
    if "." in stem:
        raise SourceError(
            f"{where}: the sample key {stem!r} contains a '.'; WebDataset readers split key and "
            "extension at the first dot of a file's base name, so this sample would be read back "
            "under another key. Rename the file without extra dots (e.g. replace '.' with '_'), "
            "or use a CSV/JSONL list with an explicit 'key' column."
        )


def check_key(key: str, where: str) -> None:
    """Refuse a key (``folder/sub/name``) that readers would not give back as written.

    Raises:
        SourceError: An empty or absolute key, ``.``/``..`` components, a dot in the base name,
            or a name readers skip (``__MACOSX/...``); ``where`` names the source item.
    """
    parts = key.split("/")
    if not key or any(part in ("", "..", ".") for part in parts):
        raise SourceError(
            f"{where}: unusable sample key {key!r} (empty, absolute, or with '.'/'..' "
            "components). Use relative paths below the list file, or add a 'key' column."
        )
    check_key_stem(parts[-1], where)
    if split_key(f"{key}.x") != (key, "x"):
        raise SourceError(
            f"{where}: sample key {key!r} is a name WebDataset readers skip (macOS resource "
            "forks under '__MACOSX'); rename it or leave the file out."
        )


def member_name(key: str, extension: str, where: str) -> str:
    """The tar member name of field ``extension`` of sample ``key``, checked to read back.

    Raises:
        SourceError: The extension is empty, starts or ends with a dot, or holds a slash, so
            readers would group the member under another key or skip it.

    Examples:
        >>> member_name("a/x", "seg.png", "sample #0")
        'a/x.seg.png'
    """
    name = f"{key}.{extension}"
    if "/" in extension or split_key(name) != (key, extension):
        raise SourceError(
            f"{where}: field {extension!r} cannot be a member extension: readers would read "
            f"{name!r} back under another key or skip it. Use names such as 'jpg', 'cls' or "
            "'seg.png' (no leading or trailing dot, no '/')."
        )
    return name


def key_hash(key: str) -> int:
    """A 64-bit hash of a key, stable across processes (unlike ``hash``)."""
    digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "little", signed=True)


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
