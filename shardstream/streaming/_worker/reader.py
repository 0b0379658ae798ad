"""Fields attached by key (``shardstream attach``), added to the samples a worker reads.

A shard's fields are one small Parquet file (:mod:`shardstream._format.columns`), read once
when a worker first reads that shard and kept, as Python values, for the shards it reads at a
time (within a byte budget: a shuffled pass reads from hundreds of shards at once); each piece
takes its samples' rows, and each sample gets its row's values as members.

One worker's shard reader: open a run of samples of any shard, with its caches and limits.

A DataLoader worker makes one :class:`ShardReader` per pass. It holds what the worker keeps
between pieces (indexes and walked offsets, see :mod:`.pieces`; each store's byte ranges, see
:meth:`shardstream._storage.Store.ranges`) and the read settings, so the rest of the worker asks
only for ``open(shard, first, stop)``."""

from __future__ import annotations

import collections
import dataclasses
import functools
import itertools
import logging
import re
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import numpy as np

from shardstream._catalog.shardlist import ShardList, ShardSource, ShardSpec
from shardstream._format.columns import column_file, read_column_table
from shardstream._format.shardindex import ShardIndex
from shardstream._format.tarreader import DEFAULT_MAX_MEMBER_BYTES, is_gzip_name
from shardstream.errors import ShardFormatError, StorageError
from shardstream.streaming._worker.pieces import IndexCache, OffsetIndex, open_piece

__all__ = [
    "FieldCache",
    "ReadSettings",
    "SKIP_ADVICE",
    "ShardReader",
    "WorkerStats",
]


#: Bytes of fields a worker keeps (as Python values: about 64 bytes a value, counted so).
DEFAULT_FIELD_CACHE_BYTES = 128 << 20
_PYTHON_BYTES = 64


class FieldCache:
    """The attached fields of recently read shards (least recently used dropped).

    Args:
        max_bytes: Bytes of field tables kept.
    """

    def __init__(self, max_bytes: int = DEFAULT_FIELD_CACHE_BYTES) -> None:
        self._max_bytes, self._bytes = max_bytes, 0
        self._tables: collections.OrderedDict[tuple[int, str], dict[str, list[Any]]] = (
            collections.OrderedDict()
        )
        self._sizes: dict[tuple[int, str], int] = {}

    def attach(
        self, samples: Iterator[Any], source: ShardSource, local: int, name: str, store: int,
        positions: Sequence[int],
    ) -> Iterator[Any]:  # fmt: skip
        """``samples`` (read at stored ``positions`` of shard ``local`` of ``source``) with
        their fields; shards appended after the attach get None for every field."""
        if source.columns is None:
            return samples
        folder_store, columns = source.columns
        if local >= columns.num_shards:
            rows = {field: [None] * len(positions) for field in columns.fields}
        else:
            table = self._table(folder_store, column_file(columns.folder, name), store)
            rows = _rows(table, positions)
        return _with_fields(samples, rows)

    def _table(self, folder: Any, name: str, store: int) -> dict[str, list[Any]]:
        key = (store, name)
        values = self._tables.get(key)
        if values is not None:
            self._tables.move_to_end(key)
            return values
        table = read_column_table(folder, name)
        values = self._tables[key] = table.to_pydict()  # indexed per sample: Python lists
        self._sizes[key] = size = _PYTHON_BYTES * table.num_rows * max(1, table.num_columns)
        self._bytes += size
        while self._bytes > self._max_bytes and len(self._tables) > 1:
            dropped, _ = self._tables.popitem(last=False)
            self._bytes -= self._sizes.pop(dropped)
        return values


def _rows(values: dict[str, list[Any]], positions: Sequence[int]) -> dict[str, list[Any]]:
    """The fields of the rows at ``positions`` (one slice when they follow each other)."""
    if isinstance(positions, range) and positions.step == 1:
        return {field: column[positions.start : positions.stop] for field, column in values.items()}
    return {field: [column[p] for p in positions] for field, column in values.items()}


def _with_fields(samples: Iterator[Any], rows: dict[str, list[Any]]) -> Iterator[Any]:
    names = list(rows)
    values = zip(*rows.values(), strict=False)  # one row per sample read, in order
    for sample in samples:
        row = next(values, None)
        if sample is not None:  # a broken sample's placeholder (on_error="skip") stays None
            sample.update(zip(names, row or itertools.repeat(None), strict=False))
        yield sample


logger = logging.getLogger("shardstream.streaming")

#: Pieces announced first, before the rest of a window's indexes are read: more than a first
#: batch draws from (about ``min(batch_size, num_open)``) at the default batch sizes.
_FIRST_PIECES = 64

#: The advice to skip, cut from messages of errors that are being skipped.
SKIP_ADVICE = re.compile(r",? or pass on_error='skip'[^.]*")


@dataclasses.dataclass(frozen=True)
class ReadSettings:
    """How a worker reads shards.

    Attributes:
        max_member_bytes: Largest tar member read into memory.
        memory_map: Read indexed local shards through memory maps.
        on_error: ``"raise"``, or ``"skip"`` broken samples (counted, never shifting batches).
        tag_streams: Add ``__stream__`` (the shard's store number) to every sample (mixtures).
        max_idle_handles: Idle local file handles kept open between pieces.
        max_indexes: Shard indexes kept loaded (a window reads from up to ``num_open`` shards;
            8 to 16 bytes per sample each).
        fields: Add fields attached by key (``shardstream attach``) to the samples.
    """

    max_member_bytes: int = DEFAULT_MAX_MEMBER_BYTES
    memory_map: bool = True
    on_error: str = "raise"
    tag_streams: bool = False
    max_idle_handles: int = 64
    max_indexes: int = 256
    fields: bool = True


@dataclasses.dataclass
class WorkerStats:
    """What one worker counted in a pass."""

    skipped: int = 0
    batches: int = 0
    bytes_read: int = 0  # of indexed ranges (whole samples), counted per range
    #: Shards whose read errors were logged in this pass (each is logged once).
    broken: set[str] = dataclasses.field(default_factory=set)


class ShardReader:
    """Opens runs of samples of a dataset's shards for one worker.

    Args:
        shards: The dataset's shards.
        settings: Read settings.
        stats: Where skipped samples are counted.

    Examples:
        >>> reader = ShardReader(shards, ReadSettings())  # doctest: +SKIP
        >>> samples = list(reader.open(3, 0, 8))  # doctest: +SKIP
        >>> reader.close()  # doctest: +SKIP
    """

    def __init__(
        self, shards: ShardList, settings: ReadSettings, stats: WorkerStats | None = None
    ) -> None:
        self.shards, self.settings = shards, settings
        self.stats = stats if stats is not None else WorkerStats()
        idle = settings.max_idle_handles
        self._ranges = [source.shards.ranges(max_idle=idle) for source in shards.sources]
        self._indexes = [
            IndexCache.shared(source.indexes, settings.max_indexes) for source in shards.sources
        ]
        self._walked = OffsetIndex()
        self._fields = FieldCache()
        self._kept: dict[int, np.ndarray] = {}  # a view's kept ordinals of recent shards
        self._specs: dict[int, ShardSpec] = {}  # recent shards' specs (a piece asks twice)
        # Recent shards' URLs without credentials, by (source, name): a mixture's datasets (and
        # merged roots) have shards of the same names.
        self._urls: dict[tuple[int, str], str] = {}
        self._max_specs = settings.max_indexes
        self._announces = any(ranges.announces for ranges in self._ranges)

    @property
    def announces(self) -> bool:
        """True when announced pieces are fetched ahead (some shards are on an object store)."""
        return self._announces

    def _spec(self, shard: int) -> ShardSpec:
        spec = self._specs.get(shard)
        if spec is None:
            if len(self._specs) >= self._max_specs:
                self._specs.clear()
                self._urls.clear()
            spec = self._specs[shard] = self.shards.spec(shard)
        return spec

    def open(self, shard: int, first: int, stop: int | None) -> Iterator[Any]:
        """Samples ``[first, stop)`` of shard number ``shard`` (``None``: to its end).

        With ``on_error="skip"`` a broken shard ends the run in ``None`` placeholders (one per
        missing sample, so batch boundaries do not move), which the worker counts as skipped
        where its batches take them (another worker may take some of a run's samples); a
        shard's first error in a pass is logged.
        """
        spec = self._spec(shard)
        index = self._index_of(spec)
        if self._filtered(spec):
            samples = self._selected(shard, spec, index, first, stop)
        else:
            samples = self._range(spec, first, stop, index.offsets if index else None)
        source = self.shards.sources[spec.store_index]
        if source.columns is not None and self.settings.fields:  # fields attached by key
            positions = self._positions(shard, spec, index, first, stop)
            local = self.shards.locate(shard)[1]
            samples = self._fields.attach(
                samples, source, local, spec.name, spec.store_index, positions
            )
        settings = self.settings
        if settings.tag_streams:
            samples = _tagged(samples, spec.store_index)
        if settings.on_error != "skip":
            return samples  # errors propagate as they are: no layer to pass through
        return self._guarded(samples, spec.name, None if stop is None else stop - first)

    def prefetch(self, pieces: Sequence[tuple[int, int, int | None]], group: Hashable) -> None:
        """Announce pieces ``(shard, first, stop)`` this worker opens next, soonest first.

        Remote stores fetch the byte ranges of indexed pieces in the background, within
        ``ReadOptions.prefetch_bytes`` (see :meth:`Store.prefetch`); ``group`` (one per
        stream cursor) replaces its earlier announcements. A no-op for local shards.
        """
        if not self._announces:
            return
        wanted = []
        for shard, first, stop in pieces:
            spec = self._spec(shard)
            source = self.shards.sources[spec.store_index]
            if source.selection is None and self._ranges[spec.store_index].announces:
                if spec.excluded:  # the stored span that holds the kept samples
                    first, stop = _stored_span(self._kept_ordinals(shard, spec, None), first, stop)
                wanted.append((spec, first, stop))  # views read runs of kept samples
        # A fresh reader loads the first pieces' indexes first and announces their ranges, so
        # their GETs start while the other indexes come: what stands before its first piece
        # GET is one round of index reads, however many shards the window holds. (Only when
        # no index is loaded yet: then nothing announced before can be dropped by the first
        # announcement, which replaces the group's.)
        if len(wanted) > _FIRST_PIECES and not any(map(self._holds_index, wanted)):
            self._announce(wanted[:_FIRST_PIECES], group)
        self._announce(wanted, group)

    def _holds_index(self, piece: tuple[ShardSpec, int, int | None]) -> bool:
        spec = piece[0]
        return spec.index is not None and self._indexes[spec.store_index].holds(spec.index)

    def _announce(
        self, wanted: Sequence[tuple[ShardSpec, int, int | None]], group: Hashable
    ) -> None:
        """Load the indexes of ``wanted`` pieces ``(spec, first, stop)``; announce their ranges
        (replacing ``group``'s earlier announcements)."""
        self._preload_indexes([spec for spec, _, _ in wanted])
        ranges: dict[int, list[tuple[str, int, int]]] = {}
        for spec, first, stop in wanted:
            index = self._index_of(spec)
            if index is None:
                continue
            offsets = index.offsets
            end = len(offsets) - 1 if stop is None else min(stop, len(offsets) - 1)
            if first < end:
                piece = (spec.name, int(offsets[first]), int(offsets[end]))
                ranges.setdefault(spec.store_index, []).append(piece)
        for number, announced in ranges.items():
            self._ranges[number].announce(announced, group)

    def _preload_indexes(self, specs: Sequence[ShardSpec]) -> None:
        """Load the indexes of ``specs`` that are not cached yet, all at once per store."""
        wanted: dict[int, list[tuple[str, int | None, int | None]]] = {}
        for spec in specs:
            if spec.index is not None and not is_gzip_name(spec.name):
                wanted.setdefault(spec.store_index, []).append(
                    (spec.index, spec.num_samples, spec.num_bytes)
                )
        for number, items in wanted.items():
            self._indexes[number].preload(items)

    def forget(self, group: Hashable) -> None:
        """Drop what :meth:`prefetch` announced for ``group`` (closing streams not taken)."""
        for ranges in self._ranges:
            if ranges.announces:
                ranges.forget(group)

    def index(self, shard: int) -> ShardIndex | None:
        """Shard number ``shard``'s index (offsets, key hashes), or None when it has none."""
        return self._index_of(self.shards.spec(shard))

    def kept(self, shard: int) -> np.ndarray | None:
        """A view's kept ordinals of shard number ``shard`` (None outside views)."""
        spec = self.shards.spec(shard)
        if not self._filtered(spec):
            return None
        return self._kept_ordinals(shard, spec, self._index_of(spec))

    def _positions(
        self, shard: int, spec: ShardSpec, index: ShardIndex | None, first: int, stop: int | None
    ) -> Sequence[int]:
        """The stored positions of kept samples ``[first, stop)`` of a shard."""
        if self._filtered(spec):
            return self._kept_ordinals(shard, spec, index)[first:stop].tolist()
        return range(first, (spec.num_samples or 0) if stop is None else stop)

    def _filtered(self, spec: ShardSpec) -> bool:
        """Whether the shard's read samples are not all it stores (a view's, or exclusions)."""
        return bool(spec.excluded) or self.shards.sources[spec.store_index].selection is not None

    def _index_of(self, spec: ShardSpec) -> ShardIndex | None:
        if spec.index is None or is_gzip_name(spec.name):
            return None
        view = self.shards.sources[spec.store_index].selection is not None
        # A view's count is of kept samples; a version's counts leave its exclusions out.
        count = None if view or spec.num_samples is None else spec.num_samples + spec.excluded
        return self._indexes[spec.store_index].get(spec.index, count, spec.num_bytes)

    def _range(
        self, spec: ShardSpec, first: int, stop: int | None, offsets: Sequence[int] | None
    ) -> Iterator[Any]:
        settings = self.settings
        if offsets is not None:
            end = len(offsets) - 1 if stop is None else min(stop, len(offsets) - 1)
            self.stats.bytes_read += int(offsets[end]) - int(offsets[min(first, end)])
        ranges = self._ranges[spec.store_index]
        url = self._urls.get((spec.store_index, spec.name))
        if url is None:
            url = self._urls[spec.store_index, spec.name] = ranges.store.shown(spec.name)
        return open_piece(
            ranges, spec.name, first, stop, self._walked, offsets, settings.max_member_bytes,
            settings.memory_map, url,
        )  # fmt: skip

    def _selected(
        self, shard: int, spec: ShardSpec, index: ShardIndex | None, first: int, stop: int | None
    ) -> Iterator[Any]:
        """Kept samples ``[first, stop)`` of a view's shard: runs of its source's samples."""
        ordinals = self._kept_ordinals(shard, spec, index)[first:stop]
        breaks = np.flatnonzero(np.diff(ordinals) != 1) + 1
        starts = np.concatenate([[0], breaks]).tolist()
        ends = np.concatenate([breaks, [len(ordinals)]]).tolist()
        offsets = index.offsets if index is not None else None
        return itertools.chain.from_iterable(
            self._range(spec, int(ordinals[a]), int(ordinals[b - 1]) + 1, offsets)
            for a, b in zip(starts, ends, strict=True)
            if b > a
        )

    def _kept_ordinals(self, shard: int, spec: ShardSpec, index: ShardIndex | None) -> np.ndarray:
        kept = self._kept.get(shard)
        if kept is None:
            source = self.shards.sources[spec.store_index]
            hashes = None if index is None else index.key_hashes
            if source.selection is not None and hashes is None:
                raise ShardFormatError(
                    f"{spec.name}: a view reads its shards through their indexes' key hashes, "
                    "and this shard's index has none (or is missing); run `shardstream index` "
                    "on the source dataset"
                )
            stored = (spec.num_samples or 0) + spec.excluded
            try:
                kept = source.kept(self.shards.locate(shard)[1], stored, hashes)
            except ValueError as error:
                raise ShardFormatError(
                    f"{spec.name}: {error}; the exclusion list is corrupt"
                ) from error
            if len(self._kept) >= 64:
                self._kept.clear()
            self._kept[shard] = kept
        if spec.num_samples is not None and len(kept) != spec.num_samples:
            raise ShardFormatError(
                f"{spec.name}: the view keeps {spec.num_samples} of its samples, its index "
                f"gives {len(kept)}; the source dataset changed after the view was made"
            )
        return kept

    def _guarded(self, samples: Iterator[Any], name: str, count: int | None) -> Iterator[Any]:
        """``samples``, then a ``None`` for each of the ``count`` not read after an error.

        The placeholders are counted where a batch takes them (:class:`.pipeline.Batcher`):
        a run's samples after the error may be other workers' (they read the same run), or
        be passed over. A whole shard (``count`` None) counts one.
        """
        produced = 0
        try:
            for sample in samples:
                produced += 1
                yield sample
        except (ShardFormatError, StorageError) as error:
            if count is None:
                self.stats.skipped += 1
            if name not in self.stats.broken:  # once per shard and pass: pieces fail alike
                self.stats.broken.add(name)
                logger.warning(
                    "skipping samples that cannot be read (on_error='skip'; the count follows "
                    "at the end of the pass): %s", SKIP_ADVICE.sub("", str(error)),
                )  # fmt: skip
            if count is not None:
                yield from itertools.repeat(None, count - produced)

    def close(self) -> None:
        """Close every idle handle and drop the maps (handles still lent are closed when given
        back)."""
        for ranges in self._ranges:
            ranges.close()


def _stored_span(kept: np.ndarray, first: int, stop: int | None) -> tuple[int, int | None]:
    """The stored positions ``[a, b)`` that hold kept samples ``[first, stop)``."""
    chosen = kept[first:stop]
    return (int(chosen[0]), int(chosen[-1]) + 1) if len(chosen) else (0, 0)


def _tagged(samples: Iterator[Any], stream: int) -> Iterator[Any]:
    return map(functools.partial(_tag, stream=stream), samples)  # no generator to close


def _tag(sample: Any, stream: int) -> Any:
    sample["__stream__"] = stream
    return sample
