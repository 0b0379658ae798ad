"""Sources: an ImageFolder tree or a CSV/JSONL list, scanned into a compact :class:`FileTable`.

Scanning is deterministic without sorting one giant list: each directory is listed with
``os.scandir`` and its (small) list of entries sorted, then sub-folders are visited in sorted
order. Classes are the sorted top-level sub-folders (the ImageFolder convention); a file nested
deeper belongs to its top-level class.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from shardstream import codecs
from shardstream.errors import DuplicateKeyError, SourceError
from shardstream.manifest import SkippedSample
from shardstream.shardwriter.keys import check_key_stem, find_duplicate_keys
from shardstream.shardwriter.lists import read_list
from shardstream.shardwriter.records import FileTable, FileTableBuilder

__all__ = ["ScannedSource", "scan_image_folder", "scan_source"]

logger = logging.getLogger(__name__)

LIST_SUFFIXES = (".csv", ".jsonl", ".ndjson")


@dataclasses.dataclass(frozen=True)
class ScannedSource:
    """A scanned file source.

    Attributes:
        kind: ``"imagefolder"``, ``"csv"`` or ``"jsonl"``.
        table: Every usable file, in deterministic source order.
        class_names: Class names in label order, or ``None``.
        skipped: Items dropped during the scan under ``on_error="skip"``.
    """

    kind: str
    table: FileTable
    class_names: tuple[str, ...] | None
    skipped: tuple[SkippedSample, ...] = ()


def scan_source(source: str | os.PathLike[str], on_error: str = "raise") -> ScannedSource:
    """Scan a folder (ImageFolder) or a ``.csv``/``.jsonl`` list file.

    Raises:
        SourceError: The source is missing, empty, or has unusable keys.
        DuplicateKeyError: Two files map to one sample key.
    """
    path = os.fspath(source)
    if os.path.isdir(path):
        return scan_image_folder(path)
    if os.path.isfile(path) and path.lower().endswith(LIST_SUFFIXES):
        kind = "csv" if path.lower().endswith(".csv") else "jsonl"
        table, class_names, skipped = read_list(path, kind, on_error)
        duplicate = find_duplicate_keys(table)
        if duplicate is not None:
            first, second = duplicate
            raise DuplicateKeyError(
                f"{path}: entries {table.path(first)!r} and {table.path(second)!r} both have key "
                f"{table.key(first)!r}; a shard can hold only one sample per key. Remove one "
                "entry or give each a distinct 'key' column."
            )
        return ScannedSource(kind, table, class_names, skipped)
    raise SourceError(
        f"{path}: not found or not a supported source. Expected an ImageFolder directory (one "
        f"sub-folder per class) or a list file ending in {', '.join(LIST_SUFFIXES)}."
    )


def scan_image_folder(root: str) -> ScannedSource:
    """Scan an ImageFolder tree: ``root/CLASS/[nested/]NAME.EXT``.

    Example:
        >>> source = scan_image_folder("data/train")  # doctest: +SKIP
        >>> len(source.table), source.class_names[:2]  # doctest: +SKIP
        (1281167, ('n01440764', 'n01443537'))
    """
    class_names = _class_folders(root)
    builder = FileTableBuilder(root)
    ignored = [0]
    for label, name in enumerate(class_names):
        _scan_directory(root, name, label, builder, ignored)
    if ignored[0]:
        logger.info("%s: ignored %d files that are not images or are hidden", root, ignored[0])
    if len(builder) == 0:
        raise SourceError(
            f"{root}: no image files found under its class folders (expected "
            f"CLASS/NAME.EXT with EXT one of {sorted(codecs.IMAGE_EXTENSIONS)})."
        )
    logger.info("%s: %d images in %d classes", root, len(builder), len(class_names))
    return ScannedSource("imagefolder", builder.build(), tuple(class_names))


def _class_folders(root: str) -> list[str]:
    names = []
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.is_dir() and not entry.name.startswith("."):
                names.append(entry.name)
    if not names:
        raise SourceError(
            f"{root}: no class sub-folders. An ImageFolder source holds one sub-folder per "
            "class (e.g. root/cat/1.jpg, root/dog/2.jpg); for a flat list use a CSV/JSONL file."
        )
    return sorted(names)


def _scan_directory(
    root: str, relative: str, label: int, builder: FileTableBuilder, ignored: list[int]
) -> None:
    with os.scandir(os.path.join(root, relative)) as iterator:
        entries = sorted(iterator, key=lambda entry: entry.name)
    stems: dict[str, str] = {}
    folders = []
    for entry in entries:
        if entry.name.startswith("."):
            ignored[0] += 1
            continue
        if entry.is_dir():
            folders.append(entry.name)
            continue
        stem, _, extension = entry.name.rpartition(".")
        if not stem or extension.lower() not in codecs.IMAGE_EXTENSIONS:
            ignored[0] += 1
            continue
        path = f"{relative}/{entry.name}"
        check_key_stem(stem, os.path.join(root, path))
        if stem in stems:
            raise DuplicateKeyError(
                f"{os.path.join(root, relative)}: files {stems[stem]!r} and {entry.name!r} both "
                f"give key {relative + '/' + stem!r}; a sample can hold one image per key. "
                "Rename or remove one of them."
            )
        stems[stem] = entry.name
        builder.add(path, label, entry.stat().st_size)
    for folder in folders:
        _scan_directory(root, f"{relative}/{folder}", label, builder, ignored)
