"""Where named samples are in a dataset version: ``(shard number, stored position)`` places.

A *place* is ``shard << 32 | stored position``: the sample's position in its shard file,
counting the samples the version excludes (see :mod:`shardstream.format.exclusions`).
``exclude``, ``dups`` and ``attach`` name samples by key, by ``(shard, key)`` or by a version's
position; these functions turn each into places, reading only the indexes they need.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from shardstream.errors import ConfigError, ShardFormatError
from shardstream.format.exclusions import Exclusions, is_in, sorted_unique
from shardstream.format.manifest import Manifest
from shardstream.format.roots import root_store
from shardstream.format.shardindex import index_key_hashes
from shardstream.format.shardtable import NameColumn
from shardstream.storage import Store
from shardstream.storage.remote.batchread import read_ranges

__all__ = ["match_keys", "positions_to_places", "shard_key", "shard_numbers"]

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
