"""Excluding samples in place: a new version that leaves them out, without rewriting a shard.

:func:`exclude_samples` publishes the next version of a dataset: the same shard files, their
counts less the excluded samples, and the exclusion list (:mod:`shardstream.format.exclusions`)
that readers skip. Readers of older versions are unaffected; a job resumes its epoch on the
version it began with, like after an append. The cost grows with the samples excluded (and
the shards they are in), never with the dataset, except for bare keys, whose shards are found
by reading every shard's index. ``shardstream compact`` then rewrites the shards that hold
excluded samples, so their bytes are gone.

Samples are named by key (every sample with that key), by ``(shard, key)`` (only that shard's
index is read), or by position in the published version (``RandomAccessDataset`` positions).
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from shardstream._version import __version__
from shardstream.catalog.locate import match_keys, positions_to_places, shard_numbers
from shardstream.catalog.versions import publish_version
from shardstream.errors import ConfigError, DatasetExistsError
from shardstream.format.exclusions import Exclusions, is_in, sorted_unique
from shardstream.format.keys import key_hash
from shardstream.format.manifest import Manifest, read_manifest
from shardstream.format.shardtable import ShardTable
from shardstream.storage import StorageOptions, Store
from shardstream.storage.lock import destination_lock

__all__ = ["exclude_samples"]

logger = logging.getLogger(__name__)

#: Build state folders of a build or append (shardwriter) and of an index run (catalog).
_UNFINISHED = ("_shardstream_build/plan.json", "_shardstream_index/plan.json")
Progress = Callable[[int, int], None]


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
