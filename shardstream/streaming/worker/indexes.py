"""What a worker knows of its shards' samples between pieces: indexes and walked offsets.

A worker reads many short pieces, several from the same shard. When the shard has a byte-offset
index (``shard-NNNNNN.idx``), the worker loads it once into a small :class:`IndexCache` (kept
across epochs in the process). Shards without an index (made by other tools, not yet indexed)
are walked from byte 0, and each walk records the offsets it passes in a bounded
:class:`OffsetIndex`, so later pieces of that shard start closer. File handles and memory maps
are storage's (:meth:`shardstream.storage.Store.ranges`).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Sequence

from shardstream.errors import ShardFormatError
from shardstream.format.shardindex import ShardIndex, decode_index, index_version
from shardstream.storage import Store
from shardstream.storage.processlocal import ProcessLocal
from shardstream.storage.remote.batchread import read_ranges

__all__ = ["IndexCache", "OffsetIndex"]

logger = logging.getLogger("shardstream.streaming")
#: An index of 16M samples; real shards hold thousands.
_MAX_INDEX_BYTES = 128 << 20


class IndexCache:
    """Byte-offset indexes of recently read shards, loaded once each (least recently used dropped).

    An index that cannot be read or is corrupt is logged once and remembered as missing: pieces
    of that shard are then read by walking the shard, as for shards without an index.

    Args:
        store: Where the indexes are.
        max_shards: Indexes kept; memory is 8 bytes per sample of each.

    Examples:
        >>> cache = IndexCache(Store("shards/train"))  # doctest: +SKIP
        >>> offsets = cache.get("shard-000000.idx")  # doctest: +SKIP
    """

    def __init__(self, store: Store, max_shards: int = 256) -> None:
        self._store = store
        self._max_shards = max_shards
        self._indexes: collections.OrderedDict[str, ShardIndex | None] = collections.OrderedDict()

    @classmethod
    def shared(cls, store: Store, max_shards: int = 256) -> IndexCache:
        """This process's cache for ``store`` (kept across epochs: a persistent DataLoader
        worker loads each index once), holding at least ``max_shards`` indexes."""
        caches = _shared_caches.get()
        # The same URL on another endpoint is another dataset: the options are part of the key.
        key = (store.url(""), repr(sorted(store.storage_options.items())))
        cache = caches.get(key)
        if cache is None:
            cache = caches[key] = cls(store, max_shards)
        cache._max_shards = max(cache._max_shards, max_shards)
        return cache

    def get(
        self, name: str, num_samples: int | None = None, num_bytes: int | None = None
    ) -> ShardIndex | None:
        """Index ``name`` (offsets: samples then end; key hashes), or None when unusable.

        ``num_samples`` and ``num_bytes`` (the manifest's) are checked against the index, so an
        index of another build is not used.
        """
        if name in self._indexes:
            self._indexes.move_to_end(name)
            return self._indexes[name]
        (data,) = read_ranges(self._store, [(name, _read_end(num_samples))])
        return self._keep(name, self._decode(name, data, num_samples, num_bytes))

    def preload(self, wanted: Sequence[tuple[str, int | None, int | None]]) -> None:
        """Load the indexes ``(name, num_samples, num_bytes)`` not cached yet, all at once
        (on an object store: one request latency for all of them, not one each)."""
        missing = {name: (count, size) for name, count, size in wanted if name not in self._indexes}
        items = list(missing.items())[: self._max_shards]
        found = read_ranges(self._store, [(name, _read_end(count)) for name, (count, _) in items])
        for (name, (count, size)), data in zip(items, found, strict=True):
            self._keep(name, self._decode(name, data, count, size))

    def _keep(self, name: str, index: ShardIndex | None) -> ShardIndex | None:
        self._indexes[name] = index
        while len(self._indexes) > self._max_shards:
            self._indexes.popitem(last=False)
        return index

    def _decode(
        self, name: str, data: bytes | OSError, num_samples: int | None, num_bytes: int | None
    ) -> ShardIndex | None:
        shown = self._store.shown(name)
        try:
            if isinstance(data, OSError):  # StorageError is an OSError too
                raise data
            if (
                num_samples is not None
                and len(data) > _index_end(num_samples)
                and index_version(data) < 3  # a version 3 names its count in its header
            ):
                # More samples than the manifest says (one was read past them): read it
                # whole, so the message names both counts.
                (data,) = read_ranges(self._store, [(name, _index_end(None))])
                if isinstance(data, OSError):
                    raise data
            if len(data) > _MAX_INDEX_BYTES:
                raise ShardFormatError(f"{shown}: larger than {_MAX_INDEX_BYTES} bytes")
            return decode_index(data, shown, num_samples, num_bytes)
        except (OSError, ShardFormatError) as error:
            logger.warning("%s: not using this shard index, walking the shard (%s)", shown, error)
            return None


def _index_end(num_samples: int | None) -> int:
    """The size of a version-2 index of ``num_samples`` (header, offsets and end, key hashes),
    at most the limit+1; 8 bytes more are a version-3 index up to its digests."""
    if num_samples is None:
        return _MAX_INDEX_BYTES + 1
    return min(_MAX_INDEX_BYTES + 1, 16 + 8 * (num_samples + 1) + 8 * num_samples)


def _read_end(num_samples: int | None) -> int:
    """Bytes to read of an index: all of one of ``num_samples`` in one request, and 8 bytes
    more, so an index of more samples than the manifest says is seen (not read cut short)."""
    return min(_MAX_INDEX_BYTES + 1, _index_end(num_samples) + 8)


_shared_caches: ProcessLocal[dict[tuple[str, str], IndexCache]] = ProcessLocal(dict)


class OffsetIndex:
    """Byte offsets of the first samples of recently read shards (least recently used dropped).

    Args:
        max_shards: Shards remembered; memory is about 8 bytes per remembered sample.
    """

    def __init__(self, max_shards: int = 64) -> None:
        self._offsets: collections.OrderedDict[str, list[int]] = collections.OrderedDict()
        self._max_shards = max_shards

    def get(self, url: str) -> list[int]:
        """Known offsets of samples ``0..len-1`` of ``url`` (a list to extend in place)."""
        offsets = self._offsets.get(url)
        if offsets is None:
            offsets = self._offsets[url] = []
            while len(self._offsets) > self._max_shards:
                self._offsets.popitem(last=False)
        else:
            self._offsets.move_to_end(url)
        return offsets
