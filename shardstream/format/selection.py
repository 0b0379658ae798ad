"""Which samples a view keeps: a rule on key hashes, the same for the writer and every reader.

A view (a subset of a dataset, see :mod:`shardstream.catalog.views`) keeps a sample by its
key alone, never by its position, so a view stays the same however the source dataset's shards
are read, and a train/val split by key puts every key on one side for good. The key hashes come
from the shards' indexes (:mod:`shardstream.format.shardindex`, version 2), so choosing costs
no reading of the shards:

- ``range``: keep the keys whose seeded uniform draw ``u(key)`` lies in ``[low, high)``; a 10%
  subset is ``[0, 0.1)``, a 90/10 split is ``[0, 0.9)`` and ``[0.9, 1)`` with one seed;
- ``keys``: keep the keys of a list (their hashes, sorted, in a file next to the view).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from shardstream.errors import ConfigError, ManifestError

__all__ = ["Selection", "key_draws"]

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
        """Keep exactly these keys (hashes, see :func:`shardstream.format.keys.key_hash`)."""
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
