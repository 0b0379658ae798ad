"""The one key rule: how tar member names group into samples, for every reader and writer.

WebDataset readers (this one, ``webdataset``, timm, Hugging Face ``datasets``) group adjacent
members ``dir/name.ext`` by *key*: the path up to the first ``.`` of the base name. So
``a/b/x.seg.png`` is member ``seg.png`` of sample ``a/b/x``. Names that are not sample members
are skipped: directories, names without an extension (``x``, ``x.``), dotfiles (``.x.jpg``) and
macOS resource forks (``__MACOSX/...``).

:func:`split_key` is that rule; the reader, :mod:`~shardstream.format.verify` and the writer
all use it, and the writer refuses any key or extension that would not read back as written
(:func:`member_name`).
"""

from __future__ import annotations

import hashlib

from shardstream.errors import SourceError

__all__ = ["check_key", "check_key_stem", "key_hash", "member_name", "split_key"]


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
