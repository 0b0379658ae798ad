"""``verify --decode``: decode every image member of a dataset with Pillow, as training does.

``build`` checks images cheaply (signature and end marker, or the header: see
:mod:`shardstream.shardwriter._tasks`), so damage inside a JPEG's compressed data, with its
markers intact, passes it and ``verify`` (which checks bytes against the manifest). This check
decodes each image fully; Pillow's verdict is the one the CPU decode path gives in training.
It costs a full decode of every image (see the CHANGELOG for a measurement). Pixel members
(``build --pixels``) are checked as readers read them: header and size.

Reading a whole shard once with the real reader: counts, offsets, checksum, problems.

``shardstream verify`` compares a scan with the manifest and the shard's index; indexing shards
made by other tools (``shardstream index``) writes a scan's offsets and counts. Both therefore
group members into samples exactly as the streaming reader does (:mod:`shardstream._format.keys`).
Memory per scan is the index (8 bytes per sample) plus 8 bytes per key for the check that no
key comes back after other keys: bounded by the shard, not by the dataset.

Verify a finished dataset: every shard's bytes, sha256, sample count, member layout and index.

Each shard is read once with the streaming reader's own parser and key rule
(:func:`~shardstream._format.verify.scan_shard`), so verify accepts exactly what training reads."""

from __future__ import annotations

import array
import dataclasses
import hashlib
import io
import os
import re
import warnings
from collections.abc import Callable, Sequence
from typing import IO, Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from shardstream._format.codecs import is_pixels, pixel_array
from shardstream._format.exclusions import Selection
from shardstream._format.keys import key_hash, sample_digest
from shardstream._format.manifest import (
    Manifest,
    ShardInfo,
    read_manifest,
    root_store,
    view_selection,
)
from shardstream._format.shardindex import decode_index
from shardstream._format.tarformat import BLOCK
from shardstream._format.tarreader import (
    DEFAULT_MAX_MEMBER_BYTES,
    iter_samples,
    open_tar,
    stream_size,
)
from shardstream._storage import StorageOptions, Store, as_store
from shardstream.errors import ChecksumMismatchError, DecodeError, ShardFormatError

__all__ = [
    "IMAGE_EXTENSIONS",
    "ShardScan",
    "check_shard",
    "find_problems",
    "find_undecodable",
    "scan_shard",
    "verify_dataset",
    "without_skip_hint",
]


#: Members decoded as images (what the streaming decoders take for images).
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm"})
_FAILURES = (OSError, ValueError, SyntaxError, UnidentifiedImageError, Image.DecompressionBombError)


def find_undecodable(
    store: Store, manifest: Manifest, progress: Callable[[int], None] | None = None
) -> list[str]:
    """One line per image member of the dataset's samples that Pillow cannot decode.

    Samples the version excludes, or a view leaves out, are not decoded.

    Examples:
        >>> find_undecodable(Store("shards/train"), read_manifest("shards/train"))  # doctest: +SKIP
        ["shard-000003.tar: key 'n01440764_10026' member 'jpg' does not decode (...)"]
    """
    shards, selection = root_store(store, manifest.shard_root), view_selection(store, manifest)
    found: list[str] = []
    for number, info in enumerate(manifest.shards):
        excluded: set[int] = set()
        if manifest.exclusions is not None:
            excluded = {int(position) for position in manifest.exclusions.positions(number)}
        with shards.open_read(info.name) as stream:
            samples = iter_samples(open_tar(stream, shards.shown(info.name)))
            for position, (sample, _) in enumerate(samples):
                key = str(sample["__key__"])
                if position in excluded or (
                    selection is not None
                    and not selection.keep(np.array([key_hash(key)], np.int64))[0]
                ):
                    continue
                found += _undecodable(sample, f"{info.name}: key {key!r}")
        if progress is not None:
            progress(number + 1)
    return found


def _undecodable(sample: dict, where: str) -> list[str]:
    found = []
    for name, data in sample.items():
        if is_pixels(name):  # stored decoded (build --pixels): its header and size must agree
            try:
                pixel_array(data, "")
            except DecodeError as error:
                found.append(f"{where} member {name!r} does not decode ({error})")
            continue
        if name.startswith("__") or name.rpartition(".")[2].lower() not in IMAGE_EXTENSIONS:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a decompression bomb warning is not damage
                with Image.open(io.BytesIO(data)) as image:
                    image.load()
        except _FAILURES as error:
            found.append(f"{where} member {name!r} does not decode ({error})")
    return found


@dataclasses.dataclass
class ShardScan:
    """What one pass over a shard found.

    Attributes:
        num_samples: Samples (groups of adjacent members with one key).
        num_bytes: Bytes of the shard file (compressed bytes for ``.tar.gz``).
        sha256: Hex sha256 of the shard's bytes, or None when not computed.
        offsets: Byte offset of every sample, then where the last one ends (the index), or
            None for a gzipped shard (its offsets cannot be read by byte range).
        key_hashes: The key hash of every sample (see :func:`~shardstream._format.keys.key_hash`).
        digests: The content digest of every sample (16 bytes each, see
            :mod:`~shardstream._format.keys`), or None when the scan hopped over member data.
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


def verify_dataset(
    dataset: Store | str | os.PathLike[str], storage_options: StorageOptions = None
) -> Manifest:
    """Re-read every shard and compare it with the manifest; return the manifest when all match.

    Raises:
        ManifestNotFoundError: ``dataset`` has no manifest.
        ChecksumMismatchError: Some shard differs; the message lists every mismatch.

    Examples:
        >>> verify_dataset("shards/train").num_samples  # doctest: +SKIP
        1281167
    """
    store = as_store(dataset, storage_options)
    manifest = read_manifest(store)
    problems = find_problems(store, manifest)
    if problems:
        raise ChecksumMismatchError(
            f"{store.shown()}: {len(problems)} problem(s) found:\n  "
            + "\n  ".join(problems)
            + "\nRebuild the dataset (shardstream build --overwrite) or restore the shards."
        )
    return manifest


@dataclasses.dataclass(frozen=True)
class _Where:
    """Where a manifest's shards and indexes are, and what its shards may hold."""

    shards: Store
    indexes: Store
    selection: Selection | None  # a view counts only the samples it keeps
    extra_members: bool  # indexed with allow_extra_members: file members outside samples
    foreign: bool  # indexed shards of other tools (directory entries are fine there)


def find_problems(
    dataset: Store, manifest: Manifest, progress: Callable[[int], None] | None = None
) -> list[str]:
    """Every mismatch between the shards and ``manifest``, one message each ([] when none);
    ``progress`` is called with the number of shards checked after each one."""
    settings = manifest.settings
    where = _Where(
        root_store(dataset, manifest.shard_root),
        root_store(dataset, manifest.index_root),
        view_selection(dataset, manifest),
        bool(settings.get("allow_extra_members", False)),
        bool(settings.get("indexed", False)),
    )
    problems: list[str] = []
    excluded = manifest.exclusions
    for number, shard in enumerate(manifest.shards, start=1):
        positions = None if excluded is None else excluded.positions(number - 1)
        problems.extend(check_shard(where.shards, shard, where, positions))
        if progress is not None:
            progress(number)
    return problems


def check_shard(
    dataset: Store, shard: ShardInfo, where: _Where | None = None,
    excluded: np.ndarray | None = None,
) -> list[str]:  # fmt: skip
    """Mismatches of one shard (missing, size, sha256, sample count, member layout, index);
    ``excluded``: the stored positions the version leaves out (not counted in the manifest)."""
    where = where or _Where(dataset, dataset, None, False, False)
    try:
        with dataset.open_read(shard.name) as stream:
            scan = scan_shard(stream, dataset.shown(shard.name))
    except FileNotFoundError:
        return [f"{dataset.shown(shard.name)}: missing (expected {shard.num_bytes} bytes)"]
    problems = list(scan.problems)
    unexpected = (0 if where.extra_members else scan.stray_files) + (
        0 if where.foreign else scan.skipped_members
    )
    if unexpected:
        problems.append(
            f"{shard.name}: {unexpected} unexpected member(s) such as "
            f"{scan.skipped_example!r} (not KEY.EXT file members)"
        )
    if shard.index is not None and scan.offsets is not None:
        problems.extend(_check_index(where.indexes, shard, scan.offsets, scan.digests))
    if scan.num_bytes != shard.num_bytes:
        problems.append(
            f"{shard.name}: size expected {shard.num_bytes} bytes, found {scan.num_bytes}"
        )
    if shard.sha256 is not None and scan.sha256 != shard.sha256:
        problems.append(f"{shard.name}: sha256 expected {shard.sha256}, found {scan.sha256}")
    kept = np.ones(scan.num_samples, dtype=bool)
    if where.selection is not None:
        kept = where.selection.keep(np.asarray(scan.key_hashes, np.int64))
    if excluded is not None and len(excluded):
        if int(excluded[-1]) >= scan.num_samples:
            problems.append(f"{shard.name}: excludes sample {int(excluded[-1])}, beyond its end")
        kept[excluded[excluded < scan.num_samples]] = False
    found = int(kept.sum())
    if found != shard.num_samples:
        problems.append(f"{shard.name}: samples expected {shard.num_samples}, found {found}")
    return problems


def _check_index(
    dataset: Store, shard: ShardInfo, offsets: Sequence[int], digests: bytes | None
) -> list[str]:
    """Compare the shard's index with the sample offsets (and content digests) found while
    scanning the shard."""
    index = shard.index or ""
    try:
        decoded = decode_index(dataset.read_bytes(index), index)
    except FileNotFoundError:
        return [f"{shard.index}: index missing (the manifest names it for {shard.name})"]
    except ShardFormatError as error:
        return [without_skip_hint(str(error))]
    stored = decoded.offsets
    if list(stored) == list(offsets):
        if decoded.digests is None or digests is None or decoded.digests.tobytes() == digests:
            return []
        found = np.frombuffer(digests, np.uint8).reshape(-1, 16)
        if len(found) != len(decoded.digests):
            return [f"{shard.index}: content digests do not match {shard.name}'s samples"]
        sample = int(np.flatnonzero(np.any(found != decoded.digests, axis=1))[0])
        return [f"{shard.index}: sample {sample}'s content digest differs from {shard.name}'s"]
    if len(stored) != len(offsets):
        return [
            f"{shard.index}: index has {len(stored)} offsets, {shard.name} needs {len(offsets)} "
            "(one per sample plus the end)"
        ]
    sample = next(i for i, (a, b) in enumerate(zip(stored, offsets, strict=True)) if a != b)
    return [
        f"{shard.index}: entry {sample} says byte offset {stored[sample]}, but in {shard.name} "
        f"it is {offsets[sample]}"
    ]
