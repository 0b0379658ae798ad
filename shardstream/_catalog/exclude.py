"""Where named samples are in a dataset version: ``(shard number, stored position)`` places.

A *place* is ``shard << 32 | stored position``: the sample's position in its shard file,
counting the samples the version excludes (see :mod:`shardstream._format.exclusions`).
``exclude``, ``dups`` and ``attach`` name samples by key, by ``(shard, key)`` or by a version's
position; these functions turn each into places, reading only the indexes they need.

Excluding samples in place: a new version that leaves them out, without rewriting a shard.

:func:`exclude_samples` publishes the next version of a dataset: the same shard files, their
counts less the excluded samples, and the exclusion list (:mod:`shardstream._format.exclusions`)
that readers skip. Readers of older versions are unaffected; a job resumes its epoch on the
version it began with, like after an append. The cost grows with the samples excluded (and
the shards they are in), never with the dataset, except for bare keys, whose shards are found
by reading every shard's index. ``shardstream compact`` then rewrites the shards that hold
excluded samples, so their bytes are gone.

Samples are named by key (every sample with that key), by ``(shard, key)`` (only that shard's
index is read), or by position in the published version (``RandomAccessDataset`` positions)."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from shardstream._catalog.versions import publish_version
from shardstream._format.exclusions import Exclusions, is_in, sorted_unique
from shardstream._format.keys import key_hash
from shardstream._format.manifest import Manifest, read_manifest, root_store
from shardstream._format.shardindex import index_key_hashes
from shardstream._format.shardtable import NameColumn, ShardTable
from shardstream._storage import StorageOptions, Store
from shardstream._storage.store import destination_lock, read_ranges
from shardstream._version import __version__
from shardstream.errors import ConfigError, DatasetExistsError, ShardFormatError

__all__ = [
    "exclude_samples",
    "match_keys",
    "positions_to_places",
    "shard_key",
    "shard_numbers",
]


_BATCH = 256  # indexes read at once (on an object store, in flight together)
_ODD = np.uint64(0x9E3779B97F4A7C15)
Progress = Callable[[int, int], None]


def shard_numbers(names: NameColumn, wanted: list[str], store: Store) -> np.ndarray:
    """The numbers of the shards named ``wanted`` in a version's name column.

    Raises:
        ConfigError: A name the version does not list (names the first few).
    """
    if names.template is not None:
        prefix, width, suffix, first = names.template
        numbers = [_template_number(name, prefix, width, suffix) - first for name in wanted]
        result = np.array(numbers, dtype=np.int64)
    else:
        where = {name: number for number, name in enumerate(names)}
        result = np.array([where.get(name, -1) for name in wanted], dtype=np.int64)
    missing = [name for name, number in zip(wanted, result.tolist(), strict=True)
               if not 0 <= number < len(names)]  # fmt: skip
    if missing:
        raise ConfigError(
            f"{store.shown()}: lists no shard named {missing[0]!r} ({len(missing)} name(s) "
            f"unknown); name shards as the manifest does, such as {names[0]!r}"
        )
    return result


def _template_number(name: str, prefix: str, width: int, suffix: str) -> int:
    middle = name[len(prefix) : len(name) - len(suffix)] if suffix else name[len(prefix) :]
    ok = name.startswith(prefix) and name.endswith(suffix) and middle.isdigit()
    return int(middle) if ok and len(middle) == width else -(2**62)


def match_keys(
    store: Store, base: Manifest, numbers: np.ndarray, key_hashes: np.ndarray,
    key_shards: np.ndarray | None, progress: Progress | None,
) -> tuple[np.ndarray, set[int]]:  # fmt: skip
    """The places of the samples of shards ``numbers`` (sorted) whose keys are wanted, and the
    hashes of the keys found. Wanted are the sorted ``key_hashes`` in any shard, or with
    ``key_shards`` (sorted, one per hash), each hash in its shard only. Indexes are read in
    batches (on an object store, a batch's reads at once), and each batch is matched at once,
    against the keys of its own shards."""
    indexes = root_store(store, base.index_root)
    column = base.shards.indexes
    found_hashes: set[int] = set()
    parts = []
    for first in range(0, len(numbers), _BATCH):
        batch = numbers[first : first + _BATCH]
        names = [_index_of(base, column, number) for number in batch.tolist()]
        found = read_ranges(indexes, [(name, None) for name in names])
        hashes = [_key_hashes(indexes, name, data) for name, data in zip(names, found, strict=True)]
        sizes = np.array([len(item) for item in hashes], np.int64)
        shards = np.repeat(batch.astype(np.int64), sizes)
        every = np.concatenate(hashes) if hashes else np.empty(0, np.int64)
        if key_shards is None:
            hits = np.flatnonzero(is_in(every, key_hashes))
        else:
            low, high = np.searchsorted(key_shards, [batch[0], batch[-1] + 1])
            mine = sorted_unique(shard_key(key_shards[low:high], key_hashes[low:high]))
            hits = np.flatnonzero(is_in(shard_key(shards, every), mine))
        found_hashes.update(every[hits].tolist())
        positions = hits - np.repeat(np.cumsum(sizes) - sizes, sizes)[hits]
        parts.append((shards[hits] << np.int64(32)) | positions)
        if progress is not None:
            progress(min(first + _BATCH, len(numbers)), len(numbers))
    places = np.sort(np.concatenate(parts)) if parts else np.empty(0, np.int64)
    if base.exclusions is not None:  # excluded already: not again
        places = places[~is_in(places, base.exclusions.places)]
    return places, found_hashes


def shard_key(shards: np.ndarray, key_hashes: np.ndarray) -> np.ndarray:
    """One 64-bit value for a key in a shard (the key hash mixed with the shard number)."""
    with np.errstate(over="ignore"):
        mixed = (np.asarray(shards, np.int64).astype(np.uint64) + np.uint64(1)) * _ODD
        return np.asarray(key_hashes, np.int64) ^ mixed.view(np.int64)


def _key_hashes(indexes: Store, name: str, data: bytes | OSError) -> np.ndarray:
    if isinstance(data, OSError):
        raise data
    try:
        hashes = index_key_hashes(data, name)  # the URL only for a message: it costs a regex
    except ShardFormatError as error:
        raise ShardFormatError(str(error).replace(name, indexes.shown(name), 1)) from error
    if hashes is None:
        raise ConfigError(
            f"{indexes.shown(name)}: has no key hashes (an older build); run "
            "`shardstream index --overwrite` on the dataset first, or exclude by position"
        )
    return hashes


def _index_of(base: Manifest, column: NameColumn | None, number: int) -> str:
    name = column[number] if column is not None else ""
    if not name:
        raise ConfigError(
            f"{base.shards.names[number]}: has no index (a gzipped shard cannot be read by "
            "key); exclude by position, or re-pack it as .tar and `shardstream index` it"
        )
    return name


def positions_to_places(base: Manifest, positions: np.ndarray) -> np.ndarray:
    """The places of positions of ``base`` (a version's positions skip its exclusions)."""
    counts = np.asarray(base.shards.num_samples, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)])
    if len(positions) and (positions[0] < 0 or positions[-1] >= starts[-1]):
        bad = positions[0] if positions[0] < 0 else positions[-1]
        raise ConfigError(
            f"position {int(bad)} is outside version {base.version}'s {int(starts[-1])} samples"
        )
    shards = np.searchsorted(starts, positions, side="right") - 1
    ordinals = positions - starts[shards]
    stored = ordinals + _excluded_before(base.exclusions, shards, ordinals)
    return (shards.astype(np.int64) << np.int64(32)) | stored


def _excluded_before(
    exclusions: Exclusions | None, shards: np.ndarray, ordinals: np.ndarray
) -> np.ndarray:
    """For kept ordinal ``o`` of a shard, how many excluded samples its shard stores before it.

    The ``i``-th exclusion of a shard, at stored position ``e``, comes after ``e - i`` kept
    samples; so the count is the number of the shard's exclusions with ``e - i <= o``.
    """
    if exclusions is None or not len(exclusions):
        return np.zeros(len(ordinals), np.int64)
    places = exclusions.places
    owner = places >> np.int64(32)
    first = np.searchsorted(places, owner << np.int64(32))  # each one's shard's first exclusion
    adjusted = (owner << np.int64(32)) | ((places & 0xFFFFFFFF) - (np.arange(len(places)) - first))
    low = np.searchsorted(adjusted, shards.astype(np.int64) << np.int64(32), side="left")
    high = np.searchsorted(adjusted, (shards.astype(np.int64) << 32) | ordinals, side="right")
    return (high - low).astype(np.int64)


logger = logging.getLogger(__name__)

#: Build state folders of a build or append (shardwriter) and of an index run (catalog).
_UNFINISHED = ("_shardstream_build/plan.json", "_shardstream_index/plan.json")


def exclude_samples(
    dataset: str | os.PathLike[str],
    keys: Iterable[str] | None = None,
    *,
    shard_keys: Iterable[tuple[str, str]] | None = None,
    positions: Iterable[int] | np.ndarray | None = None,
    storage_options: StorageOptions = None,
    progress: Progress | None = None,
) -> Manifest:
    """Publish the next version of ``dataset`` without the named samples; return its manifest.

    Exactly one of ``keys``, ``shard_keys`` and ``positions`` names the samples. Names that
    match no sample are logged (how many, a few of them); when nothing is left to exclude, no
    version is published and the published manifest is returned. Run again after a kill, it
    publishes the same version; run again after it finished, it publishes nothing.

    Args:
        dataset: The dataset folder or URL (built, appended to, or indexed; not a view).
        keys: Exclude every sample with one of these keys (reads every shard's index).
        shard_keys: ``(shard name, key)`` pairs: only the named shards' indexes are read.
        positions: Positions ``0 .. num_samples - 1`` of the published version.
        storage_options: fsspec options for a URL.
        progress: Called as ``progress(shards_done, shards)`` while indexes are read.

    Raises:
        ConfigError: Not exactly one way of naming samples, a position out of range, a shard
            name the dataset lacks, or a view.
        DatasetExistsError: A build, append or index into the dataset is unfinished or
            running, or another writer published this version meanwhile.

    Examples:
        >>> manifest = exclude_samples("shards/train", ["n01440764_10026"])  # doctest: +SKIP
        >>> manifest.version, manifest.exclusions.count(0)  # doctest: +SKIP
        (3, 1)
    """
    chosen = [keys is not None, shard_keys is not None, positions is not None]
    if sum(chosen) != 1:
        raise ConfigError("exclude takes exactly one of keys, shard_keys or positions")
    store = Store(os.fspath(dataset), storage_options)
    request = _Request(keys, shard_keys, positions)
    with destination_lock(store, "exclude"):
        base = _base(store)
        if base.settings.get("exclusion", {}).get("request") == request.digest:
            shown = store.shown()
            logger.warning("%s: version %d already holds this exclusion", shown, base.version)
            return base
        return _publish(store, base, request.places(store, base, progress), request.digest)


def _base(store: Store) -> Manifest:
    for name in _UNFINISHED:
        if store.exists(name):
            raise DatasetExistsError(
                f"{store.shown()}: a build, append or index into it is unfinished ({name}); "
                "run its command again to finish it (or `shardstream abandon` an append), "
                "then exclude"
            )
    base = read_manifest(store)
    if base.view is not None:
        raise ConfigError(
            f"{store.shown()}: is a view; exclude from its source dataset, then make the view again"
        )
    return base


class _Request:
    """What to exclude, as given (sorted, repeats dropped), and its digest (a rerun's is the
    same)."""

    def __init__(
        self,
        keys: Iterable[str] | None,
        shard_keys: Iterable[tuple[str, str]] | None,
        positions: Iterable[int] | np.ndarray | None,
    ) -> None:
        digest = hashlib.sha256()
        self.positions = self.keys = self.pairs = None
        if positions is not None:
            self.positions = sorted_unique(np.asarray(positions, dtype=np.int64))
            digest.update(b"positions\0" + self.positions.tobytes())
        elif keys is not None:
            self.keys = sorted(set(keys))
            digest.update(b"keys\0" + "\n".join(self.keys).encode("utf-8", "surrogateescape"))
        else:
            self.pairs = sorted(set(shard_keys or ()))
            text = "\n".join(map("\t".join, self.pairs))
            digest.update(b"shard_keys\0" + text.encode("utf-8", "surrogateescape"))
        self.digest = digest.hexdigest()

    def places(self, store: Store, base: Manifest, progress: Progress | None) -> np.ndarray:
        """The places (``shard << 32 | stored position``) of the samples named in ``base``."""
        if self.positions is not None:
            return positions_to_places(base, self.positions)
        if self.keys is not None:
            wanted = sorted_unique(np.fromiter(map(key_hash, self.keys), np.int64, len(self.keys)))
            numbers = np.arange(len(base.shards))
            places, found = match_keys(store, base, numbers, wanted, None, progress)
            _log_missing(store, self.keys, found)
            return places
        pairs = self.pairs or []
        shards = shard_numbers(base.shards.names, [shard for shard, _ in pairs], store)
        hashes = np.fromiter((key_hash(key) for _, key in pairs), np.int64, len(pairs))
        order = np.argsort(shards, kind="stable")
        shards, hashes = shards[order], hashes[order]
        places, found = match_keys(store, base, sorted_unique(shards), hashes, shards, progress)
        _log_missing(store, [key for _, key in pairs], found)
        return places


def _log_missing(store: Store, keys: list[str], found: set[int]) -> None:
    missing = [key for key in keys if key_hash(key) not in found]
    if missing:
        examples = ", ".join(repr(key) for key in missing[:5])
        logger.warning(
            "%s: %d of the %d keys asked for are in no shard it names (such as %s); nothing "
            "is excluded for them", store.shown(), len(missing), len(keys), examples,
        )  # fmt: skip


def _publish(store: Store, base: Manifest, places: np.ndarray, request: str) -> Manifest:
    """Publish the next version with ``places`` excluded too (nothing when there are none)."""
    version = base.version + 1
    if base.exclusions is not None:  # excluded already: keeps the version that excluded it
        places = places[~is_in(places, base.exclusions.places)]
    new = Exclusions(places, np.full(len(places), version, np.uint32))
    if not len(new):
        logger.warning("%s: nothing to exclude; no version published", store.shown())
        return base
    table = base.shards
    counts = table.num_samples - new.counts(len(table))
    every = new if base.exclusions is None else base.exclusions.merged(new)
    settings: dict[str, Any] = {
        **base.settings,
        "exclusion": {"request": request, "version": version, "num_samples": len(new)},
    }
    manifest = Manifest(
        shards=ShardTable(table.names, counts, table.num_bytes, table.sha256, table.indexes),
        class_names=base.class_names, settings=settings, skipped=base.skipped,
        created_by=f"shardstream {__version__} exclude", shard_root=base.shard_root,
        index_root=base.index_root, version=version, exclusions=every, columns=base.columns,
    )  # fmt: skip
    publish_version(store, manifest)
    logger.info(
        "%s: version %d: %d samples (%d excluded)", store.shown(), version,
        manifest.num_samples, len(new),
    )  # fmt: skip
    return manifest
