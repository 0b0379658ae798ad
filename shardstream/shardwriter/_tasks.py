"""Image checks and optional re-encoding (PIL); pass-through bytes are never re-encoded.

:func:`check_image` is the cheap guard used when bytes pass through unchanged: JPEG and PNG are
checked by their signature and end marker (which catches garbage and truncated files without
decoding), other formats by PIL's header parser. :func:`reencode_jpeg` serves ``resize`` and
``quality``: JPEGs are decoded at reduced scale with ``Image.draft`` when much larger than the
target, which makes resizing several times faster. :func:`decode_pixels` serves ``pixels``:
the image decoded once, resized, and stored as ``uint8`` pixels (:mod:`shardstream._format.codecs`).

Build options: one frozen dataclass, validated on construction.

The unit of parallel work: write one planned chunk of samples as one (or more) shards.

:func:`write_chunk` is a top-level function taking one picklable :class:`ChunkTask`, so any
``concurrent.futures.Executor`` can run it (local processes, Dask, Ray). It writes its shards
into the build-state folder under part names, then a small JSON record of what it wrote; the
coordinator gives parts their final names in plan order once every chunk is done."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from PIL import Image, UnidentifiedImageError

from shardstream._format.codecs import PIXELS_EXTENSION, PixelSize, encode_pixels, pixel_shape
from shardstream._format.manifest import ShardInfo, SkippedSample
from shardstream._format.shardindex import encode_offsets, index_name
from shardstream._format.tarformat import END_BYTES, TarShardWriter, member_size
from shardstream._format.verify import without_skip_hint
from shardstream._storage import Store
from shardstream.errors import ConfigError, SourceError
from shardstream.shardwriter._records import FileTable

__all__ = [
    "BuildOptions",
    "ChunkResult",
    "ChunkTask",
    "DEFAULT_MAX_BYTES",
    "DEFAULT_QUALITY",
    "Member",
    "Sample",
    "check_image",
    "decode_pixels",
    "normalized_extension",
    "part_name",
    "record_name",
    "reencode_jpeg",
    "write_chunk",
]


DEFAULT_QUALITY = 90
_JPEG_START = b"\xff\xd8\xff"
_JPEG_END = b"\xff\xd9"
_PNG_START = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND"
#: Bytes searched for the end marker: cameras may append trailing data after it.
_TAIL_SEARCH = 64 * 1024
_EXTENSIONS = {"jpeg": "jpg", "tiff": "tif"}


def normalized_extension(path: str) -> str:
    """Member extension for an image file: ``.JPEG``/``.jpeg`` -> ``jpg``, else lower-cased."""
    extension = path.rpartition(".")[2].lower()
    return _EXTENSIONS.get(extension, extension)


def check_image(data: bytes, extension: str, where: str) -> None:
    """Raise :class:`SourceError` when ``data`` is clearly not a complete image.

    Raises:
        SourceError: Empty, wrong signature, truncated (no end marker) or unparseable header.
    """
    if not data:
        raise SourceError(f"{where}: empty file (0 bytes); expected an image")
    if extension == "jpg":
        _check_markers(data, _JPEG_START, _JPEG_END, "JPEG", where)
    elif extension == "png":
        _check_markers(data, _PNG_START, _PNG_END, "PNG", where)
    else:
        try:
            with Image.open(io.BytesIO(data)):
                pass
        except (UnidentifiedImageError, OSError, ValueError) as error:
            raise SourceError(f"{where}: not a readable image ({error})") from error


def _check_markers(data: bytes, start: bytes, end: bytes, kind: str, where: str) -> None:
    if not data.startswith(start):
        raise SourceError(
            f"{where}: not a {kind} file (expected signature {start!r}, found "
            f"{data[: len(start)]!r}); fix or remove the file, or pass on_error='skip'"
        )
    if data.rfind(end, max(0, len(data) - _TAIL_SEARCH)) < 0:
        raise SourceError(
            f"{where}: truncated {kind} ({len(data)} bytes, no end marker {end!r} found); "
            "re-download or remove the file, or pass on_error='skip'"
        )


def reencode_jpeg(data: bytes, shorter_side: int | None, quality: int | None, where: str) -> bytes:
    """Decode an image, shrink its shorter side to ``shorter_side`` (aspect kept) and save JPEG.

    Images whose shorter side is already at most ``shorter_side`` are not enlarged.

    Raises:
        SourceError: The image cannot be decoded.
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            if shorter_side and image.format == "JPEG":
                scale = shorter_side / min(image.size)
                image.draft("RGB", (int(image.width * scale), int(image.height * scale)))
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise SourceError(f"{where}: cannot decode image ({error})") from error
    if shorter_side and min(rgb.size) > shorter_side:
        width, height = rgb.size
        scale = shorter_side / min(width, height)
        target = (
            (shorter_side, max(1, round(height * scale)))
            if width <= height
            else (max(1, round(width * scale)), shorter_side)
        )
        rgb = rgb.resize(target, Image.Resampling.BICUBIC, reducing_gap=None)
    buffer = io.BytesIO()
    rgb.save(buffer, format="JPEG", quality=quality or DEFAULT_QUALITY)
    return buffer.getvalue()


def decode_pixels(data: bytes, size: PixelSize, where: str) -> np.ndarray:
    """Decode an image to RGB and resize it to ``size``: ``uint8`` of shape ``(height, width, 3)``.

    Large JPEGs are decoded at reduced DCT scale first (never below the target), then resized
    with Pillow's antialiased bicubic filter, as ``resize`` re-encoding does.

    Raises:
        SourceError: The image cannot be decoded.
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = size.target(*image.size)
            if image.format == "JPEG":
                image.draft("RGB", (width, height))
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise SourceError(f"{where}: cannot decode image ({error})") from error
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.Resampling.BICUBIC, reducing_gap=None)
    return np.asarray(rgb)


DEFAULT_MAX_BYTES = 256 * 10**6
ON_ERROR_CHOICES = ("raise", "skip")


@dataclasses.dataclass(frozen=True)
class BuildOptions:
    """How :func:`~shardstream.build_shards` cuts, orders and encodes samples.

    Attributes:
        max_samples_per_shard: Most samples in one shard (``None``: no limit but bytes).
        max_bytes_per_shard: Most bytes in one shard file, tar end blocks included. A single
            sample larger than this gets a shard of its own (and a warning).
        workers: Local worker processes when no executor is passed; 1 builds in-process.
            The output is identical for any value.
        seed: Seed of the global shuffle (``numpy.random.default_rng(seed)``).
        shuffle: Shuffle samples across the whole source (file sources only); ``False`` keeps
            source order.
        resize: Shrink images so that their shorter side is at most this many pixels, and
            write JPEG. ``None`` passes the original bytes through.
        quality: JPEG quality when re-encoding (implies JPEG output); ``None`` means 90 when
            ``resize`` is set, else no re-encoding.
        pixels: Store every image decoded once, as ``uint8`` pixels in a ``KEY.pixels.npy``
            member (what ``numpy.load`` reads), at this size: ``"short=N"`` (shorter side
            exactly N pixels, aspect kept) or ``"WxH"`` (a fixed box, aspect not kept), e.g.
            ``"short=256"``; readers then skip the decode (images only, from file sources).
            Excludes ``resize`` and ``quality``. ``None`` stores encoded images.
        on_error: ``"raise"`` stops at the first unreadable item or image that fails the
            build's check; ``"skip"`` leaves it out, logs it and lists it in
            ``manifest.skipped``. Passed-through images are checked by signature and end
            marker (JPEG, PNG) or header (others), not decoded: damage inside an image's data
            is found by ``shardstream verify --decode`` (re-encoding with ``resize``,
            ``quality`` or ``pixels`` decodes every image, so it finds it too).
        overwrite: Replace a different dataset or unfinished build already in DEST.
        append: Add the source's samples to the dataset in DEST as new shards after its
            shards, and publish a new version of it.

    Examples:
        >>> BuildOptions(max_samples_per_shard=1000, resize=256).reencodes
        True
    """

    max_samples_per_shard: int | None = None
    max_bytes_per_shard: int = DEFAULT_MAX_BYTES
    workers: int = 1
    seed: int = 0
    shuffle: bool = True
    resize: int | None = None
    quality: int | None = None
    on_error: str = "raise"
    overwrite: bool = False
    append: bool = False
    pixels: str | None = None  # last: positional arguments keep their places

    def __post_init__(self) -> None:
        if self.max_samples_per_shard is not None and self.max_samples_per_shard < 1:
            raise ConfigError(
                f"max_samples_per_shard must be >= 1, got {self.max_samples_per_shard}"
            )
        if self.max_bytes_per_shard < 4096:
            raise ConfigError(
                f"max_bytes_per_shard must be >= 4096 bytes, got {self.max_bytes_per_shard}"
            )
        if self.workers < 1:
            raise ConfigError(f"workers must be >= 1, got {self.workers}")
        if self.resize is not None and self.resize < 1:
            raise ConfigError(f"resize (shorter side in pixels) must be >= 1, got {self.resize}")
        if self.quality is not None and not 1 <= self.quality <= 100:
            raise ConfigError(f"quality must be between 1 and 100, got {self.quality}")
        if self.pixels is not None:  # one spelling, in the manifest too
            object.__setattr__(self, "pixels", str(PixelSize.parse(str(self.pixels))))
            if self.resize is not None or self.quality is not None:
                raise ConfigError(
                    "pixels stores decoded pixels; resize and quality re-encode JPEG: pass "
                    "pixels alone (its size replaces resize)"
                )
        if self.append and self.overwrite:
            raise ConfigError("append and overwrite exclude each other: choose one")
        if self.on_error not in ON_ERROR_CHOICES:
            raise ConfigError(f"on_error must be one of {ON_ERROR_CHOICES}, got {self.on_error!r}")

    @property
    def reencodes(self) -> bool:
        """True when images are decoded and written again (as JPEG, or as pixels)."""
        return self.resize is not None or self.quality is not None or self.pixels is not None

    def output_settings(self) -> dict[str, Any]:
        """The settings that determine the output bytes (recorded in the manifest)."""
        settings = dataclasses.asdict(self)
        del settings["workers"], settings["overwrite"], settings["append"]
        if settings["pixels"] is None:  # absent, as in manifests written before the option
            del settings["pixels"]
        return settings


logger = logging.getLogger(__name__)

Member = tuple[str, bytes]
#: ``(key, members sorted by extension, where)``; ``where`` names the source item in errors.
Sample = tuple[str, Sequence[Member], str]


@dataclasses.dataclass(frozen=True)
class ChunkTask:
    """One chunk to write: either table rows (file sources) or encoded samples (iterables)."""

    index: int
    state: Store
    options: BuildOptions
    table: FileTable | None = None
    samples: tuple[Sample, ...] = ()
    digest: str = ""


@dataclasses.dataclass(frozen=True)
class ChunkResult:
    """What a chunk task wrote: its shards (under part names), skipped items and volume."""

    index: int
    shards: tuple[ShardInfo, ...]
    skipped: tuple[SkippedSample, ...]
    num_items: int
    num_source_bytes: int
    digest: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> ChunkResult:
        document = json.loads(text)
        return cls(
            index=document["index"],
            shards=tuple(ShardInfo(**shard) for shard in document["shards"]),
            skipped=tuple(SkippedSample(**item) for item in document["skipped"]),
            num_items=document["num_items"],
            num_source_bytes=document["num_source_bytes"],
            digest=document.get("digest", ""),
        )


def part_name(chunk_index: int, part_index: int) -> str:
    """Name of a chunk's shard inside the build-state folder (never matches ``shard-*``)."""
    return f"chunk-{chunk_index:06d}-{part_index:03d}.tar"


def record_name(chunk_index: int) -> str:
    """Name of a chunk's completion record inside the build-state folder."""
    return f"chunk-{chunk_index:06d}.json"


def write_chunk(task: ChunkTask) -> ChunkResult:
    """Write one chunk's shards and its completion record; return the record."""
    skipped: list[SkippedSample] = []
    source_bytes = [0]
    roller = _ShardRoller(task)
    try:
        for key, members, _where in _encoded_samples(task, skipped, source_bytes):
            roller.add(key, members)
        shards = roller.close()
    except BaseException:
        roller.abort()
        raise
    num_items = len(task.table) if task.table is not None else len(task.samples)
    result = ChunkResult(
        task.index, shards, tuple(skipped), num_items, source_bytes[0], task.digest
    )
    with task.state.open_atomic_write(record_name(task.index)) as stream:
        stream.write(result.to_json().encode("utf-8"))
    return result


def _encoded_samples(
    task: ChunkTask, skipped: list[SkippedSample], source_bytes: list[int]
) -> Iterator[Sample]:
    if task.table is None:
        yield from task.samples
        return
    table, options = task.table, task.options
    for index in range(len(table)):
        path = os.path.join(table.root, table.path(index))
        try:
            members = _file_members(table, index, path, options)
        except (SourceError, OSError) as error:
            error = error if isinstance(error, SourceError) else _read_error(path, error)
            if options.on_error != "skip":
                raise error from None
            reason = without_skip_hint(str(error))  # it is skipping already
            logger.warning("skipping %s", reason)
            skipped.append(SkippedSample(path, reason))
            continue
        source_bytes[0] += int(table.sizes[index])
        yield table.key(index), members, path


def _file_members(table: FileTable, index: int, path: str, options: BuildOptions) -> list[Member]:
    with open(path, "rb", buffering=0) as stream:
        data = stream.readall()
    extension = normalized_extension(path)
    if options.pixels is not None:
        data = encode_pixels(decode_pixels(data, PixelSize.parse(options.pixels), path))
        extension = PIXELS_EXTENSION
    elif options.reencodes:
        data = reencode_jpeg(data, options.resize, options.quality, path)
        extension = "jpg"
    else:
        check_image(data, extension, path)
    members = [(extension, data)]
    label = int(table.labels[index])
    if label >= 0:
        members.append(("cls", str(label).encode("ascii")))
    extra = table.extra(index)
    if extra:
        members.append(("json", extra))
    members.sort()
    return members


def _read_error(path: str, error: OSError) -> SourceError:
    return SourceError(
        f"{path}: cannot read ({error.strerror or error}); check the file exists "
        "and is readable, or pass on_error='skip'"
    )


class _ShardRoller:
    """Writes samples into successive part files, each within the shard limits."""

    def __init__(self, task: ChunkTask) -> None:
        self._task = task
        self._max_bytes = task.options.max_bytes_per_shard
        self._max_samples = task.options.max_samples_per_shard or sys.maxsize
        self._stack: contextlib.ExitStack | None = None
        self._writer: TarShardWriter | None = None
        self._count = 0
        self._shards: list[ShardInfo] = []
        #: The part's samples' pixel image sizes, while every sample has a pixel member.
        self._shapes: list[tuple[int, int]] | None = None

    def add(self, key: str, members: Sequence[Member]) -> None:
        names = [(f"{key}.{extension}", data) for extension, data in members]
        size = sum(member_size(name, len(data)) for name, data in names)
        writer = self._writer
        if writer is not None and (
            self._count >= self._max_samples
            or writer.num_bytes + size + END_BYTES > self._max_bytes
        ):
            self._finish_part(writer)
            writer = None
        if writer is None:
            writer = self._open_part()
            if size + END_BYTES > self._max_bytes and self._task.options.reencodes:
                logger.warning(
                    "sample %r (%d bytes) exceeds max_bytes_per_shard: own shard", key, size
                )
        writer.start_sample(key)
        for name, data in names:
            writer.write_member(name, data)
        self._count += 1
        if self._shapes is not None:  # every sample's pixel image size, for the index
            shape = next((pixel_shape(d) for e, d in members if e == PIXELS_EXTENSION), None)
            self._shapes = None if shape is None else [*self._shapes, shape]

    def close(self) -> tuple[ShardInfo, ...]:
        if self._writer is not None:
            self._finish_part(self._writer)
        return tuple(self._shards)

    def abort(self) -> None:
        if self._stack is not None:
            self._stack.__exit__(*sys.exc_info())
            self._stack = self._writer = None

    def _open_part(self) -> TarShardWriter:
        name = part_name(self._task.index, len(self._shards))
        self._stack = contextlib.ExitStack()
        stream = self._stack.enter_context(self._task.state.open_atomic_write(name))
        self._writer = TarShardWriter(stream)
        self._count = 0
        self._shapes = []
        return self._writer

    def _finish_part(self, writer: TarShardWriter) -> None:
        writer.finish()
        if self._stack is not None:
            self._stack.close()
        name = part_name(self._task.index, len(self._shards))
        # The index is written after its part, so a part counts as done only with its index.
        index = index_name(name)
        with self._task.state.open_atomic_write(index) as stream:
            stream.write(encode_offsets(
                writer.sample_offsets, writer.key_hashes, writer.digests, self._shapes or None
            ))  # fmt: skip
        self._shards.append(ShardInfo(name, self._count, writer.num_bytes, writer.sha256, index))
        self._stack = self._writer = None
