"""CSV and JSONL list sources: ``path,label[,more fields]`` rows, one sample per row.

Relative paths are resolved against the list file's folder. The key is an explicit ``key``
field when there is one, else the path without its extension. Labels are integers, or class
names (then sorted names give the labels). Every other field goes into the sample's ``json``
member.

Sources: an ImageFolder tree or a CSV/JSONL list, scanned into a compact :class:`FileTable`.

Scanning is deterministic without sorting one giant list: each directory is listed with
``os.scandir`` and its (small) list of entries sorted, then sub-folders are visited in sorted
order. Classes are the sorted top-level sub-folders (the ImageFolder convention); a file nested
deeper belongs to its top-level class. Links to folders are followed; a cycle is caught by
keeping the ``(st_dev, st_ino)`` of the folders on the current path only.

Iterable sources: sample dicts streamed in bounded chunks, in their given order.

An iterable cannot be shuffled globally in constant memory, so its samples are written in the
order given (shuffle it first if it is sorted by class). Samples are encoded here with
:func:`shardstream._format.codecs.encode_member` and grouped into chunks that fit the shard limits
exactly, so each chunk is one shard. Duplicate keys are caught with a set of 64-bit key hashes."""

from __future__ import annotations

import csv
import dataclasses
import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np

from shardstream._format import codecs
from shardstream._format.keys import check_key, check_key_stem, key_hash, member_name
from shardstream._format.manifest import SkippedSample
from shardstream._format.tarformat import END_BYTES, member_size
from shardstream._storage import Store
from shardstream.errors import ConfigError, DuplicateKeyError, SourceError
from shardstream.shardwriter._records import (
    FileTable,
    FileTableBuilder,
    ScanProgress,
    find_duplicate_keys,
)
from shardstream.shardwriter._tasks import BuildOptions, Sample

__all__ = [
    "ScannedSource",
    "chunk_samples",
    "encode_sample",
    "read_list",
    "refuse_destination_inside",
    "scan_image_folder",
    "scan_source",
]


logger = logging.getLogger(__name__)


def read_list(
    list_path: str, kind: str, on_error: str = "raise", progress: ScanProgress | None = None
) -> tuple[FileTable, tuple[str, ...] | None, tuple[SkippedSample, ...]]:
    """Read a CSV or JSONL list into a table, its class names and the rows skipped
    (``progress``: called every few hundred rows with the files and bytes found)."""
    root = os.path.dirname(os.path.abspath(list_path))
    rows = _csv_rows(list_path) if kind == "csv" else _jsonl_rows(list_path)
    builder = FileTableBuilder(root, with_keys=True, with_extras=True, progress=progress)
    names: dict[str, int] = {}
    skipped: list[SkippedSample] = []
    for where, row in rows:
        try:
            _add_row(builder, root, where, row, names)
        except SourceError as error:
            if on_error != "skip":
                raise
            skipped.append(SkippedSample(where, str(error)))
            logger.warning("skipped %s", error)
    if len(builder) == 0:
        raise SourceError(f"{list_path}: the list has no usable rows (expected path,label,...)")
    table = builder.build()
    if not names:
        return table, None, tuple(skipped)
    return _remap_class_names(table, names), tuple(sorted(names)), tuple(skipped)


def _add_row(
    builder: FileTableBuilder, root: str, where: str, row: dict[str, Any], names: dict[str, int]
) -> None:
    path = str(row.pop("path", "") or "")
    if not path:
        raise SourceError(f"{where}: no 'path' field")
    key = str(row.pop("key", "") or _key_from_path(path))
    check_key(key, where)
    extension = path.rpartition(".")[2].lower()
    if extension not in codecs.IMAGE_EXTENSIONS:
        raise SourceError(f"{where}: {path!r} is not an image file (by its extension)")
    label = _label(row.pop("label", None), names, where)
    try:
        size = os.stat(os.path.join(root, path)).st_size
    except OSError as error:
        raise SourceError(f"{where}: cannot read {path!r}: {error.strerror or error}") from error
    extra = json.dumps(row, sort_keys=True, separators=(",", ":")).encode() if row else b""
    builder.add(path, label, size, key=key, extra=extra)


def _key_from_path(path: str) -> str:
    normalized = path.replace("\\", "/").lstrip("/")
    while normalized.startswith("./"):
        normalized = normalized[2:]
    folder, _, name = normalized.rpartition("/")
    stem = name.rpartition(".")[0] or name
    return f"{folder}/{stem}" if folder else stem


def _label(value: Any, names: dict[str, int], where: str) -> int:
    """Integer labels pass through; class names get provisional ids (remapped once sorted)."""
    if value is None or value == "":
        return -1
    if isinstance(value, int) and not isinstance(value, bool):
        integer = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        integer = int(value)
    else:
        if not isinstance(value, str):
            raise SourceError(f"{where}: label {value!r} is neither an integer nor a class name")
        return -2 - names.setdefault(value, len(names))
    if names:
        raise SourceError(f"{where}: integer label {value!r} mixed with class-name labels")
    if integer < 0:
        raise SourceError(f"{where}: negative label {integer}")
    return integer


def _remap_class_names(table: FileTable, names: dict[str, int]) -> FileTable:
    if int(table.labels.max()) >= 0:
        raise SourceError(f"{table.root}: the list mixes integer labels and class-name labels")
    order = sorted(names)
    provisional_to_sorted = np.empty(len(names), dtype=np.int32)
    for sorted_index, name in enumerate(order):
        provisional_to_sorted[names[name]] = sorted_index
    labels = table.labels.copy()
    named = labels <= -2
    labels[named] = provisional_to_sorted[-2 - labels[named]]
    return FileTable(
        table.root, table.paths, table.offsets, labels, table.sizes, table.keys, table.extras
    )


def _csv_rows(list_path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with open(list_path, newline="", encoding="utf-8") as stream:
        reader = csv.reader(stream)
        header: list[str] | None = None
        for line_number, cells in enumerate(reader, start=1):
            if not cells or all(not cell.strip() for cell in cells):
                continue
            if header is None:
                if cells[0].strip().lower() == "path":
                    header = [cell.strip() for cell in cells]
                    continue
                header = ["path", "label"] + [f"field_{i}" for i in range(2, len(cells))]
            if len(cells) != len(header):
                raise SourceError(
                    f"{list_path}:{line_number}: expected {len(header)} fields "
                    f"({','.join(header)}), found {len(cells)}"
                )
            yield f"{list_path}:{line_number}", dict(zip(header, cells, strict=False))


def _jsonl_rows(list_path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    with open(list_path, encoding="utf-8") as stream:
        for line_number, line in enumerate(stream, start=1):
            if not line.strip():
                continue
            where = f"{list_path}:{line_number}"
            try:
                row = json.loads(line)
            except ValueError as error:
                raise SourceError(f"{where}: not valid JSON ({error})") from error
            if not isinstance(row, dict):
                raise SourceError(f"{where}: expected a JSON object with a 'path' field")
            yield where, row


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


def encode_sample(sample: Mapping[str, Any], position: int) -> Sample:
    """Turn ``{"__key__": ..., "jpg": bytes, "cls": 3, ...}`` into sorted encoded members."""
    where = f"sample #{position}"
    if not isinstance(sample, Mapping):
        raise SourceError(f"{where}: expected a dict with '__key__', got {type(sample).__name__}")
    key = sample.get("__key__")
    if not isinstance(key, str):
        raise SourceError(f"{where}: '__key__' must be a string, got {key!r}")
    where = f"sample #{position} (key {key!r})"
    check_key(key, where)
    members = []
    for extension, value in sample.items():
        if not extension.startswith("__"):
            member_name(key, extension, where)  # refuses a field that would not read back
            members.append((extension, codecs.encode_member(extension, value, where)))
    if not members:
        raise SourceError(f"{where}: no fields besides '__key__'")
    members.sort()
    return key, tuple(members), where


def chunk_samples(
    samples: Iterable[Mapping[str, Any]], options: BuildOptions
) -> Iterator[tuple[tuple[Sample, ...], str]]:
    """Yield ``(samples, digest)`` chunks that each fit one shard; ``digest`` identifies them."""
    limit = options.max_bytes_per_shard - END_BYTES
    max_samples = options.max_samples_per_shard or 2**62
    seen: set[int] = set()
    chunk: list[Sample] = []
    total = 0
    for position, raw in enumerate(samples):
        sample = encode_sample(raw, position)
        _check_unique(sample, seen)
        size = sum(member_size(f"{sample[0]}.{ext}", len(data)) for ext, data in sample[1])
        if chunk and (len(chunk) >= max_samples or total + size > limit):
            yield tuple(chunk), _digest(chunk)
            chunk, total = [], 0
        chunk.append(sample)
        total += size
    if chunk:
        yield tuple(chunk), _digest(chunk)


def _check_unique(sample: Sample, seen: set[int]) -> None:
    hashed = key_hash(sample[0])
    if hashed in seen:
        raise DuplicateKeyError(
            f"{sample[2]}: key {sample[0]!r} was already used by an earlier sample; a shard "
            "holds one sample per key. Make keys unique."
        )
    seen.add(hashed)


def _digest(chunk: list[Sample]) -> str:
    digest = hashlib.sha256()
    for key, members, _ in chunk:
        digest.update(key.encode("utf-8") + b"\0")
        for extension, data in members:
            digest.update(extension.encode("utf-8") + b"\0" + len(data).to_bytes(8, "little"))
            digest.update(data)
    return digest.hexdigest()
