"""The unit of parallel work: write one planned chunk of samples as one (or more) shards.

:func:`write_chunk` is a top-level function taking one picklable :class:`ChunkTask`, so any
``concurrent.futures.Executor`` can run it (local processes, Dask, Ray). It writes its shards
into the build-state folder under part names, then a small JSON record of what it wrote; the
coordinator gives parts their final names in plan order once every chunk is done.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence

from shardstream.errors import SourceError
from shardstream.format.manifest import ShardInfo, SkippedSample
from shardstream.format.pixels import PIXELS_EXTENSION, PixelSize, encode_pixels, pixel_shape
from shardstream.format.scan import without_skip_hint
from shardstream.format.shardindex import encode_offsets, index_name
from shardstream.format.tarheader import END_BYTES, member_size
from shardstream.format.tarwriter import TarShardWriter
from shardstream.shardwriter.imageops import (
    check_image,
    decode_pixels,
    normalized_extension,
    reencode_jpeg,
)
from shardstream.shardwriter.options import BuildOptions
from shardstream.shardwriter.records import FileTable
from shardstream.storage import Store

__all__ = [
    "ChunkResult",
    "ChunkTask",
    "Member",
    "Sample",
    "part_name",
    "record_name",
    "write_chunk",
]

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
