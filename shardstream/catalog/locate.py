"""Where named samples are in a dataset version: ``(shard number, stored position)`` places.

A *place* is ``shard << 32 | stored position``: the sample's position in its shard file,
counting the samples the version excludes (see :mod:`shardstream.format.exclusions`).
``exclude``, ``dups`` and ``attach`` name samples by key, by ``(shard, key)`` or by a version's
position; these functions turn each into places, reading only the indexes they need.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable

import numpy as np

from shardstream.errors import ConfigError
from shardstream.format.exclusions import Exclusions
from shardstream.format.manifest import Manifest
from shardstream.format.roots import root_store
from shardstream.format.shardindex import decode_index
from shardstream.format.shardtable import NameColumn
from shardstream.storage import Store

__all__ = ["match_keys", "positions_to_places", "shard_numbers"]

_READERS = 16  # index reads in flight (they wait on storage, not on the CPU)
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
    store: Store, base: Manifest, numbers: np.ndarray, wanted: Callable[[int], np.ndarray],
    progress: Progress | None,
) -> tuple[np.ndarray, set[int]]:  # fmt: skip
    """The places of the samples of shards ``numbers`` whose key hashes are in ``wanted(i)``
    (for shard ``numbers[i]``), and the hashes of the keys found."""
    indexes = root_store(store, base.index_root)
    excluded = base.exclusions
    found_hashes: set[int] = set()

    def match(item: int) -> np.ndarray:
        number = int(numbers[item])
        shard = base.shards[number]
        if shard.index is None:
            raise ConfigError(
                f"{shard.name}: has no index (a gzipped shard cannot be read by key); exclude "
                "by position, or re-pack it as .tar and `shardstream index` the dataset"
            )
        index = decode_index(indexes.read_bytes(shard.index), indexes.shown(shard.index))
        if index.key_hashes is None:
            raise ConfigError(
                f"{indexes.shown(shard.index)}: has no key hashes (an older build); run "
                "`shardstream index --overwrite` on the dataset first, or exclude by position"
            )
        hits = np.flatnonzero(np.isin(index.key_hashes, wanted(item)))
        found_hashes.update(index.key_hashes[hits].tolist())
        if excluded is not None and len(hits):
            hits = hits[~np.isin(hits, excluded.positions(number))]
        return (np.int64(number) << np.int64(32)) | hits.astype(np.int64)

    parts = []
    with cf.ThreadPoolExecutor(_READERS) as pool:
        for done, places in enumerate(pool.map(match, range(len(numbers))), start=1):
            parts.append(places)
            if progress is not None:
                progress(done, len(numbers))
    places = np.concatenate(parts) if parts else np.empty(0, np.int64)
    return np.sort(places), found_hashes


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
