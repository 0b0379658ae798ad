"""How mixed a loader's batches are, against a uniformly random permutation of the same data.

Torch-free formulas over label arrays, shared by ``shardstream bench --shuffle`` and
``benchmarks/shuffle.py``:

- :func:`distinct_per_batch`: distinct labels in each batch (a buffer shuffle over shards
  written in class order holds few);
- :func:`random_distinct`: what a random permutation gives on average, exactly, from the
  label counts;
- :func:`spearman`: rank correlation between where samples were written and when they were
  read (a random order gives about 0; an order that follows the writing order, near 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = ["distinct_per_batch", "random_distinct", "spearman"]


def distinct_per_batch(batches: Sequence[np.ndarray]) -> np.ndarray:
    """Distinct labels in each batch.

    Examples:
        >>> distinct_per_batch([np.array([1, 1, 2]), np.array([3])]).tolist()
        [2, 1]
    """
    return np.array([len(np.unique(batch)) for batch in batches], dtype=np.int64)


def random_distinct(label_counts: np.ndarray, batch_size: int) -> float:
    """Mean distinct labels in a batch of a uniformly random permutation of the samples.

    A label with ``n`` of ``N`` samples is missing from a batch of ``b`` drawn without
    replacement with probability ``C(N - n, b) / C(N, b)``.

    Examples:
        >>> round(random_distinct(np.array([1, 1]), 2), 3)
        2.0
        >>> round(random_distinct(np.array([50, 50]), 1), 3)
        1.0
    """
    counts = [int(count) for count in np.asarray(label_counts).ravel() if count > 0]
    total = sum(counts)
    batch = min(batch_size, total)
    if batch <= 0:
        return 0.0
    whole = math.lgamma(total + 1) - math.lgamma(total - batch + 1)
    absent = 0.0
    for count in counts:  # per label, not per sample: log-gamma of the binomials' ratio
        rest = total - count
        if rest >= batch:
            absent += math.exp(math.lgamma(rest + 1) - math.lgamma(rest - batch + 1) - whole)
    return len(counts) - absent


def spearman(written: np.ndarray, read_order: np.ndarray | None = None) -> float:
    """Spearman rank correlation of written positions against the order they were read in.

    Args:
        written: Each read sample's written position (any sortable key), in reading order.
        read_order: The reading positions (default ``0..n-1``).

    Examples:
        >>> spearman(np.array([0, 1, 2, 3]))
        1.0
        >>> spearman(np.array([3, 2, 1, 0]))
        -1.0
    """
    written = np.asarray(written)
    if len(written) < 2:
        return 0.0
    order = np.arange(len(written)) if read_order is None else np.asarray(read_order)
    ranks = np.empty(len(written), dtype=np.float64)
    ranks[np.argsort(written, kind="stable")] = np.arange(len(written))
    value = np.corrcoef(ranks, order)[0, 1]
    return float(round(value, 12))
