"""Sources: an ImageFolder tree or a CSV/JSONL list, scanned into a compact :class:`FileTable`.

Scanning is deterministic without sorting one giant list: each directory is listed with
``os.scandir`` and its (small) list of entries sorted, then sub-folders are visited in sorted
order. Classes are the sorted top-level sub-folders (the ImageFolder convention); a file nested
deeper belongs to its top-level class. Links to folders are followed; a cycle is caught by
keeping the ``(st_dev, st_ino)`` of the folders on the current path only.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable

from shardstream.errors import ConfigError, DuplicateKeyError, SourceError
from shardstream.format import codecs
from shardstream.format.keys import check_key_stem
from shardstream.format.manifest import SkippedSample
from shardstream.shardwriter.lists import read_list
from shardstream.shardwriter.records import (
    FileTable,
    FileTableBuilder,
    ScanProgress,
    find_duplicate_keys,
)
from shardstream.storage import Store

__all__ = ["ScannedSource", "refuse_destination_inside", "scan_image_folder", "scan_source"]

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


def scan_source(
    source: str | os.PathLike[str],
    on_error: str = "raise",
    progress: Callable[[int, int, int | None, int | None], None] | None = None,
) -> ScannedSource:
    """Scan a folder (ImageFolder) or a ``.csv``/``.jsonl`` list file.

    ``progress`` (a build's callback) is called every few hundred files as
    ``progress(files_found, bytes_found, None, None)``: the totals are not known yet.

    Raises:
        SourceError: The source is missing, empty, or has unusable keys.
        DuplicateKeyError: Two files map to one sample key.
    """
    path = os.fspath(source)
    found = None if progress is None else functools.partial(_scanned, progress)
    if found is not None:
        found(0, 0)  # the scan has begun (a bar says so before its first files)
    if os.path.isdir(path):
        return scan_image_folder(path, on_error, found)
    if os.path.isfile(path) and path.lower().endswith(LIST_SUFFIXES):
        kind = "csv" if path.lower().endswith(".csv") else "jsonl"
        table, class_names, skipped = read_list(path, kind, on_error, found)
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


def refuse_destination_inside(source: str | os.PathLike[str], dest: Store) -> None:
    """Refuse a local DEST inside a local source folder.

    The shards would be written into the image tree, and the next build or append of that
    folder would meet them (and their dataset's files) as part of its source.

    Raises:
        ConfigError: DEST is the source folder or a folder below it.
    """
    path = os.fspath(source)
    if not dest.is_local or not os.path.isdir(path):
        return
    target = dest.url()
    target = target[len("file://") :] if target.startswith("file://") else target
    root = os.path.realpath(path)
    if os.path.commonpath([root, os.path.realpath(target)]) == root:
        raise ConfigError(
            f"{dest.shown()}: inside the source folder {path}; the shards would be written "
            f"into the image tree. Choose a destination outside {path}."
        )


def _scanned(
    progress: Callable[[int, int, int | None, int | None], None], files: int, num_bytes: int
) -> None:
    progress(files, num_bytes, None, None)


def scan_image_folder(
    root: str, on_error: str = "raise", progress: ScanProgress | None = None
) -> ScannedSource:
    """Scan an ImageFolder tree: ``root/CLASS/[nested/]NAME.EXT``.

    Symbolic links to folders are followed, class folders included, as torchvision's
    ``ImageFolder`` does (``os.walk(followlinks=True)``). A link that leads back to a folder on
    its own path from ``root`` would repeat forever and is refused with a :class:`SourceError`
    naming the link and that folder; a link to any other folder (a sibling, say) is followed,
    and files reached through two paths are two samples with distinct keys.

    A broken link (its target is missing, or the OS reports a link loop) named like an image is
    handled like an unreadable image: a :class:`SourceError` under ``on_error="raise"`` (where
    torchvision would fail later, when loading it), or skipped with a warning and listed in
    ``skipped`` under ``"skip"``. Any other broken link is ignored like any other non-image
    file, with a warning (it may have been a folder of images, or a whole class).

    Args:
        root: The tree's root folder.
        on_error: ``"raise"`` or ``"skip"``, for broken links named like images.
        progress: Called every few hundred images with the images and bytes found so far.

    Raises:
        SourceError: No class folders or images, a link cycle, an unusable key, or a broken
            image link under ``on_error="raise"``.
        DuplicateKeyError: Two files of one folder give the same key (``a.jpg`` and ``a.png``).

    Examples:
        >>> source = scan_image_folder("data/train")  # doctest: +SKIP
        >>> len(source.table), source.class_names[:2]  # doctest: +SKIP
        (1281167, ('n01440764', 'n01443537'))
    """
    classes = _class_folders(root)
    scan = _TreeScan(root, on_error, progress)
    for label, (name, status) in enumerate(classes):
        scan.scan_folder(name, label, status)
    if scan.num_ignored:
        logger.info(
            "%s: ignored %d files that are not images or are hidden", root, scan.num_ignored
        )
    if len(scan.builder) == 0:
        raise SourceError(
            f"{root}: no image files found under its class folders (expected "
            f"CLASS/NAME.EXT with EXT one of {sorted(codecs.IMAGE_EXTENSIONS)})."
        )
    logger.info("%s: %d images in %d classes", root, len(scan.builder), len(classes))
    class_names = tuple(name for name, _ in classes)
    return ScannedSource("imagefolder", scan.builder.build(), class_names, tuple(scan.skipped))


def _class_folders(root: str) -> list[tuple[str, os.stat_result]]:
    """Sorted ``(name, stat)`` of the class folders (links to folders followed)."""
    folders = []
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name.startswith("."):
                continue
            if _is_broken_link(entry):
                _warn_broken_link(entry.path, "not used as a class folder")
            elif entry.is_dir():
                folders.append((entry.name, _folder_status(entry)))
    if not folders:
        raise SourceError(
            f"{root}: no class sub-folders. An ImageFolder source holds one sub-folder per "
            "class (e.g. root/cat/1.jpg, root/dog/2.jpg); for a flat list use a CSV/JSONL file."
        )
    return sorted(folders, key=lambda folder: folder[0])


class _TreeScan:
    """One ImageFolder scan: the table being built, what was left out, the folders entered."""

    def __init__(self, root: str, on_error: str, progress: ScanProgress | None) -> None:
        self.root = root
        self.on_error = on_error
        self.builder = FileTableBuilder(root, progress=progress)
        self.num_ignored = 0
        self.skipped: list[SkippedSample] = []
        #: ``(st_dev, st_ino)`` -> relative path of each folder from the root to the current
        #: one: entering any of them again would loop. Only ancestors are kept, not every
        #: folder seen, so memory grows with the tree's depth, not its size.
        self.ancestors: dict[tuple[int, int], str] = {_identity(os.stat(root)): ""}

    def scan_folder(self, relative: str, label: int, status: os.stat_result) -> None:
        """Add the images of ``root/relative`` and, in sorted order, of its sub-folders."""
        identity = _identity(status)
        if identity in self.ancestors:
            raise self._cycle_error(relative, self.ancestors[identity])
        self.ancestors[identity] = relative
        try:
            for name, folder_status in self._scan_files(relative, label):
                self.scan_folder(f"{relative}/{name}", label, folder_status)
        finally:
            del self.ancestors[identity]

    def _scan_files(self, relative: str, label: int) -> list[tuple[str, os.stat_result]]:
        """Add one folder's images; return its sub-folders, sorted."""
        with os.scandir(os.path.join(self.root, relative)) as iterator:
            entries = sorted(iterator, key=lambda entry: entry.name)
        stems: dict[str, str] = {}
        folders = []
        for entry in entries:
            if entry.name.startswith("."):
                self.num_ignored += 1
            elif _is_broken_link(entry):
                self._handle_broken_link(entry)
            elif entry.is_dir():
                folders.append((entry.name, _folder_status(entry)))
            elif (stem := _image_stem(entry.name)) is None:
                self.num_ignored += 1
            else:
                self._add_file(relative, entry, stem, stems, label)
        return folders

    def _add_file(
        self, relative: str, entry: os.DirEntry[str], stem: str, stems: dict[str, str], label: int
    ) -> None:
        path = f"{relative}/{entry.name}"
        check_key_stem(stem, os.path.join(self.root, path))
        if stem in stems:
            raise DuplicateKeyError(
                f"{os.path.join(self.root, relative)}: files {stems[stem]!r} and {entry.name!r} "
                f"both give key {relative + '/' + stem!r}; a sample can hold one image per key. "
                "Rename or remove one of them."
            )
        stems[stem] = entry.name
        self.builder.add(path, label, entry.stat().st_size)

    def _handle_broken_link(self, entry: os.DirEntry[str]) -> None:
        if _image_stem(entry.name) is None:
            self.num_ignored += 1
            _warn_broken_link(entry.path, "ignored")
            return
        error = SourceError(
            f"{entry.path}: broken symbolic link ({_link_problem(entry.path)}); restore its "
            "target, remove the link, or pass on_error='skip' (--on-error skip) to leave it out."
        )
        if self.on_error != "skip":
            raise error
        logger.warning("skipping %s", error)
        self.skipped.append(SkippedSample(entry.path, str(error)))

    def _cycle_error(self, relative: str, ancestor: str) -> SourceError:
        path = os.path.join(self.root, relative)
        looped = os.path.join(self.root, ancestor) if ancestor else self.root
        if os.path.islink(path):
            how = f"symbolic link to {os.readlink(path)!r} that leads back to {looped}"
        else:
            how = f"the same folder as {looped}, reached again through a symbolic link above it"
        return SourceError(
            f"{path}: {how}, a folder on its own path from the source root, so following it "
            "would repeat that folder forever. Remove the link or point it outside its own "
            "parent folders."
        )


def _identity(status: os.stat_result) -> tuple[int, int]:
    return status.st_dev, status.st_ino


def _folder_status(entry: os.DirEntry[str]) -> os.stat_result:
    # os.stat, not entry.stat(): on Windows the latter leaves st_dev and st_ino at zero.
    return os.stat(entry.path)


def _image_stem(name: str) -> str | None:
    """The key stem of an image file name, or ``None`` for a name that is not an image."""
    stem, _, extension = name.rpartition(".")
    if not stem or extension.lower() not in codecs.IMAGE_EXTENSIONS:
        return None
    return stem


def _is_broken_link(entry: os.DirEntry[str]) -> bool:
    """True for a link whose target is missing or cannot be resolved (a link loop)."""
    if not entry.is_symlink():
        return False
    try:
        entry.stat()  # follows the link; cached for later is_dir() and stat() calls
    except OSError:
        return True
    return False


def _link_problem(path: str) -> str:
    """``"to 'x': No such file or directory"``, for messages about a broken link."""
    try:
        target = os.readlink(path)
    except OSError as error:
        return str(error.strerror)
    try:
        os.stat(path)
    except OSError as error:
        return f"to {target!r}: {error.strerror}"
    return f"to {target!r}"


def _warn_broken_link(path: str, what: str) -> None:
    logger.warning("%s: broken symbolic link (%s), %s", path, _link_problem(path), what)
