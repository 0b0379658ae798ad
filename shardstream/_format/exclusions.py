"""Samples a dataset version leaves out, without rewriting a shard: the ``.excluded`` sidecar.

``shardstream exclude`` publishes a new version whose manifest lists the same shard files with
smaller counts, and this sidecar (``manifest.v000003.excluded``) saying which stored samples of
which shards are left out, and which version left each out. Readers turn a shard's kept
ordinals into stored positions through it, so an epoch plan stays a count per shard. A
version's sidecar holds every exclusion so far, so each version is read alone; its size grows
with the samples excluded (12 bytes each), never with the dataset.

Format (little-endian)::

    magic     8 bytes    b"SSTEXCL\0"
    version   uint64     1
    count     uint64     N: excluded samples
    places    int64 x N  shard number << 32 | stored position, increasing
    versions  uint32 x N the dataset version that excluded each

Which samples a view keeps: a rule on key hashes, the same for the writer and every reader.

A view (a subset of a dataset, see :mod:`shardstream._catalog.views`) keeps a sample by its
key alone, never by its position, so a view stays the same however the source dataset's shards
are read, and a train/val split by key puts every key on one side for good. The key hashes come
from the shards' indexes (:mod:`shardstream._format.shardindex`, version 2), so choosing costs
no reading of the shards:

- ``range``: keep the keys whose seeded uniform draw ``u(key)`` lies in ``[low, high)``; a 10%
  subset is ``[0, 0.1)``, a 90/10 split is ``[0, 0.9)`` and ``[0.9, 1)`` with one seed;
- ``keys``: keep the keys of a list (their hashes, sorted, in a file next to the view)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

from shardstream.errors import ConfigError, ManifestError

__all__ = [
    "EXCLUSIONS_VERSION",
    "Exclusions",
    "Selection",
    "excluded_name",
    "is_in",
    "key_draws",
    "sorted_unique",
]


EXCLUSIONS_VERSION = 1
_MAGIC = b"SSTEXCL\0"
_HEADER_BYTES = 24
_SHIFT = np.int64(32)
_LOW = np.int64(0xFFFFFFFF)


def sorted_unique(values: np.ndarray) -> np.ndarray:
    """``values`` sorted, repeats dropped (a sort: numpy's hashed ``unique`` is far slower on
    millions of integers).

    Examples:
        >>> sorted_unique(np.array([3, 1, 3])).tolist()
        [1, 3]
    """
    ordered = np.sort(np.asarray(values))
    keep = np.ones(len(ordered), dtype=bool)
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def is_in(values: np.ndarray, ordered: np.ndarray) -> np.ndarray:
    """Which of ``values`` are in the sorted array ``ordered`` (a binary search each: costs
    grow with ``values``, not with ``ordered``).

    Examples:
        >>> is_in(np.array([1, 2, 5]), np.array([1, 5, 9])).tolist()
        [True, False, True]
    """
    values = np.asarray(values)
    if not len(ordered):
        return np.zeros(len(values), dtype=bool)
    where = np.searchsorted(ordered, values).clip(max=len(ordered) - 1)
    return np.asarray(ordered[where] == values)


def excluded_name(version: int) -> str:
    """``manifest.v000003.excluded``: the sidecar of a version's exclusions."""
    return f"manifest.v{version:06d}.excluded"


@dataclasses.dataclass(frozen=True, eq=False)
class Exclusions:
    """The excluded samples of one dataset version, by shard number and stored position.

    Attributes:
        places: ``shard << 32 | position`` of every excluded sample, increasing (``int64``).
        versions: The version that excluded each (``uint32``).

    Examples:
        >>> excluded = Exclusions.of(np.array([3, 3, 0]), np.array([5, 1, 2]), version=2)
        >>> excluded.count(3), excluded.positions(3).tolist(), excluded.kept(3, 7).tolist()
        (2, [1, 5], [0, 2, 3, 4, 6])
    """

    places: np.ndarray
    versions: np.ndarray

    @classmethod
    def of(cls, shards: np.ndarray, positions: np.ndarray, version: int) -> Exclusions:
        """Exclusions of ``(shard, position)`` pairs (any order, repeats merged) by ``version``."""
        places = sorted_unique(_places(shards, positions))
        return cls(places, np.full(len(places), version, np.uint32))

    def __len__(self) -> int:
        return len(self.places)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Exclusions):
            return NotImplemented
        return np.array_equal(self.places, other.places) and np.array_equal(
            self.versions, other.versions
        )

    __hash__ = None  # type: ignore[assignment]

    def _span(self, shard: int) -> tuple[int, int]:
        first = int(np.searchsorted(self.places, np.int64(shard) << _SHIFT))
        stop = int(np.searchsorted(self.places, np.int64(shard + 1) << _SHIFT))
        return first, stop

    def count(self, shard: int) -> int:
        """Excluded samples of shard number ``shard``."""
        first, stop = self._span(shard)
        return stop - first

    def positions(self, shard: int) -> np.ndarray:
        """The stored positions excluded in shard number ``shard``, increasing (``int64``)."""
        first, stop = self._span(shard)
        return self.places[first:stop] & _LOW

    def counts(self, num_shards: int) -> np.ndarray:
        """Excluded samples per shard, for shards ``0 .. num_shards - 1`` (``int64``)."""
        return np.bincount(self.places >> _SHIFT, minlength=num_shards)[:num_shards]

    def shards(self) -> np.ndarray:
        """The numbers of the shards that have excluded samples, increasing."""
        return sorted_unique(self.places >> _SHIFT)

    def kept(self, shard: int, stored: int) -> np.ndarray:
        """The stored positions a reader reads of a shard of ``stored`` samples, in order."""
        positions = self.positions(shard)
        if len(positions) and positions[-1] >= stored:
            raise ValueError(
                f"shard {shard}: position {int(positions[-1])} is excluded, but it stores "
                f"{stored} samples"
            )
        keep = np.ones(stored, dtype=bool)
        keep[positions] = False
        return np.flatnonzero(keep)

    def version_of(self, shard: int, position: int) -> int | None:
        """The version that excluded stored sample ``position`` of ``shard`` (None: kept)."""
        place = (np.int64(shard) << _SHIFT) | np.int64(position)
        found = int(np.searchsorted(self.places, place))
        if found < len(self.places) and self.places[found] == place:
            return int(self.versions[found])
        return None

    def merged(self, other: Exclusions) -> Exclusions:
        """These and ``other``'s (a sample excluded in both keeps its first version)."""
        new = ~is_in(other.places, self.places)
        added, versions = other.places[new], other.versions[new]
        where = np.searchsorted(self.places, added)  # both sorted: one linear merge
        return Exclusions(
            np.insert(self.places, where, added), np.insert(self.versions, where, versions)
        )

    def without(self, shards: np.ndarray) -> Exclusions:
        """These, less every exclusion in ``shards`` (their shards were rewritten)."""
        drop = is_in(self.places >> _SHIFT, sorted_unique(np.asarray(shards, np.int64)))
        return Exclusions(self.places[~drop], self.versions[~drop])

    @functools.cached_property
    def encoded(self) -> bytes:
        """The sidecar's bytes (computed once: the manifest names their size and sha256)."""
        header = _MAGIC + EXCLUSIONS_VERSION.to_bytes(8, "little")
        return (
            header
            + len(self.places).to_bytes(8, "little")
            + self.places.astype("<i8").tobytes()
            + self.versions.astype("<u4").tobytes()
        )

    @classmethod
    def decode(cls, data: bytes | memoryview, where: str, num_shards: int) -> Exclusions:
        """Parse a sidecar (by reference: a memory map stays shared); ``where`` names it.

        Raises:
            ManifestError: Wrong magic or version, a torn file, places out of order, or a
                shard number the version's shard table does not have.
        """
        if bytes(data[:8]) != _MAGIC:
            raise ManifestError(f"{where}: not a shardstream exclusion list (bad magic)")
        version = int.from_bytes(data[8:16], "little")
        if version != EXCLUSIONS_VERSION:
            raise ManifestError(
                f"{where}: exclusion list version {version} is not supported by this release "
                f"(it reads {EXCLUSIONS_VERSION}); upgrade shardstream"
            )
        count = int.from_bytes(data[16:_HEADER_BYTES], "little")
        if len(data) != _HEADER_BYTES + 12 * count:
            raise ManifestError(f"{where}: {len(data)} bytes do not hold {count} exclusions")
        end = _HEADER_BYTES + 8 * count
        places = np.frombuffer(data, dtype="<i8", count=count, offset=_HEADER_BYTES)
        versions = np.frombuffer(data, dtype="<u4", count=count, offset=end)
        if count and (places[0] < 0 or np.less_equal(places[1:], places[:-1]).any()):
            raise ManifestError(f"{where}: exclusions are not in increasing order; it is corrupt")
        if count and int(places[-1] >> _SHIFT) >= num_shards:
            raise ManifestError(
                f"{where}: names shard {int(places[-1] >> _SHIFT)}, but the version has "
                f"{num_shards} shards; the list belongs to another version"
            )
        return cls(places, versions)


def _places(shards: np.ndarray, positions: np.ndarray) -> np.ndarray:
    shards = np.asarray(shards, np.int64)
    positions = np.asarray(positions, np.int64)
    if len(positions) and (positions.min() < 0 or positions.max() > int(_LOW)):
        raise ValueError("a stored position must lie in [0, 2**32)")
    return (shards << _SHIFT) | positions


_MULTIPLIERS = (np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def key_draws(key_hashes: np.ndarray, seed: int) -> np.ndarray:
    """A uniform draw in ``[0, 1)`` per key hash, seeded (splitmix64 of hash and seed).

    Examples:
        >>> draws = key_draws(np.arange(100_000, dtype=np.int64), seed=0)
        >>> bool(0.49 < draws.mean() < 0.51)
        True
    """
    with np.errstate(over="ignore"):
        value = np.asarray(key_hashes).astype(np.int64).view(np.uint64)
        value = value ^ (np.uint64(seed & 0xFFFFFFFFFFFFFFFF) * _GOLDEN)
        value = (value ^ (value >> np.uint64(30))) * _MULTIPLIERS[0]
        value = (value ^ (value >> np.uint64(27))) * _MULTIPLIERS[1]
        value = value ^ (value >> np.uint64(31))
    return (value >> np.uint64(11)).astype(np.float64) / float(1 << 53)


@dataclasses.dataclass(frozen=True)
class Selection:
    """A rule that keeps samples by key hash.

    Attributes:
        kind: ``"range"`` or ``"keys"``.
        seed: Seed of the draws (``range``).
        low: Lower bound of the kept draws (``range``).
        high: Upper bound of the kept draws (``range``).
        keys: Sorted key hashes to keep (``keys``).

    Examples:
        >>> kept = Selection.fraction(0.5, seed=3).keep(np.arange(1000, dtype=np.int64))
        >>> 430 < int(kept.sum()) < 570
        True
    """

    kind: str
    seed: int = 0
    low: float = 0.0
    high: float = 1.0
    keys: np.ndarray | None = dataclasses.field(default=None, compare=False)

    def __post_init__(self) -> None:
        if self.kind not in ("range", "keys"):
            raise ConfigError(f"a selection is 'range' or 'keys', got {self.kind!r}")
        if self.kind == "range" and not 0.0 <= self.low <= self.high <= 1.0:
            raise ConfigError(
                f"a range selection needs 0 <= low <= high <= 1, got {self.low}, {self.high}"
            )
        if self.kind == "keys" and self.keys is None:
            raise ConfigError("a keys selection needs its key hashes")

    @classmethod
    def fraction(cls, fraction: float, seed: int = 0) -> Selection:
        """Keep about ``fraction`` of the keys, chosen by a seeded draw."""
        return cls("range", seed, 0.0, float(fraction))

    @classmethod
    def of_keys(cls, key_hashes: np.ndarray) -> Selection:
        """Keep exactly these keys (hashes, see :func:`shardstream._format.keys.key_hash`)."""
        return cls("keys", keys=np.unique(np.asarray(key_hashes, dtype=np.int64)))

    def keep(self, key_hashes: np.ndarray) -> np.ndarray:
        """Which of these samples the selection keeps (a boolean array)."""
        if self.kind == "keys":
            keys = self.keys if self.keys is not None else np.empty(0, np.int64)
            where = np.searchsorted(keys, key_hashes)
            found = where < len(keys)
            found[found] = keys[where[found]] == np.asarray(key_hashes)[found]
            return found
        draws = key_draws(key_hashes, self.seed)
        return (draws >= self.low) & (draws < self.high)

    def as_dict(self, keys_file: str | None = None) -> dict[str, Any]:
        """Plain values for a manifest (the key hashes of ``keys`` go to ``keys_file``)."""
        if self.kind == "keys":
            return {
                "kind": "keys",
                "file": keys_file,
                "count": 0 if self.keys is None else len(self.keys),
            }
        return {"kind": "range", "seed": self.seed, "low": self.low, "high": self.high}

    @classmethod
    def from_dict(cls, data: dict[str, Any], keys: np.ndarray | None, where: str) -> Selection:
        """Inverse of :meth:`as_dict` (``keys``: the hashes read from its file)."""
        try:
            if data.get("kind") == "keys":
                if keys is None or len(keys) != int(data["count"]):
                    raise ManifestError(f"{where}: the view's key file does not match its count")
                return cls("keys", keys=keys)
            return cls("range", int(data["seed"]), float(data["low"]), float(data["high"]))
        except (KeyError, TypeError, ValueError, ConfigError) as error:
            raise ManifestError(f"{where}: malformed view selection ({error})") from error
