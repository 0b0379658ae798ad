"""Planning: a seeded global order, cut into chunks that each become one shard (or more).

With pass-through bytes the tar size of every sample is known from the scan (stat sizes and
key lengths), so each chunk fits the limits exactly and becomes exactly one shard. With
re-encoding the original size serves as an estimate; the task that writes a chunk rolls into a
further shard if the encoded samples do not fit. Either way the plan depends only on the
listing and the options, never on the number of workers.
"""

from __future__ import annotations

import itertools
import logging

import numpy as np

from shardstream.format.tarheader import BLOCK, END_BYTES, member_size
from shardstream.shardwriter.options import BuildOptions
from shardstream.shardwriter.records import FileTable

__all__ = ["cut_chunks", "plan_chunks", "sample_order", "sample_tar_sizes"]

logger = logging.getLogger(__name__)

#: Path lengths up to this many bytes give member names of at most 100 ASCII bytes, i.e. one
#: plain ustar header block per member ("KEY.json" is at most 5 bytes longer than "KEY").
_SHORT_PATH = 90


def sample_order(num_samples: int, options: BuildOptions) -> np.ndarray:
    """The global sample order: a seeded permutation, or the source order."""
    if not options.shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng(options.seed).permutation(num_samples).astype(np.int64)


def sample_tar_sizes(table: FileTable) -> np.ndarray:
    """Tar bytes of each sample as written with pass-through image bytes."""
    padded = -(-table.sizes // BLOCK) * BLOCK
    sizes = BLOCK + padded + np.where(table.labels >= 0, 2 * BLOCK, 0)
    if table.extras is not None:
        extra_lengths = np.diff(table.extras[1])
        sizes += np.where(extra_lengths > 0, BLOCK + -(-extra_lengths // BLOCK) * BLOCK, 0)
    blob, offsets = table.keys if table.keys is not None else (table.paths, table.offsets)
    lengths = np.diff(offsets)
    slow = np.flatnonzero(lengths > _SHORT_PATH) if blob.isascii() else np.arange(len(table))
    for index in slow.tolist():
        sizes[index] = _exact_sample_size(table, index)
    return sizes.astype(np.int64)


def _exact_sample_size(table: FileTable, index: int) -> int:
    from shardstream.shardwriter.imageops import normalized_extension

    key = table.key(index)
    total = member_size(f"{key}.{normalized_extension(table.path(index))}", int(table.sizes[index]))
    label = int(table.labels[index])
    if label >= 0:
        total += member_size(f"{key}.cls", len(str(label)))
    extra = table.extra(index)
    if extra:
        total += member_size(f"{key}.json", len(extra))
    return total


def cut_chunks(
    order: np.ndarray, sizes: np.ndarray, options: BuildOptions, warn_oversize: bool = True
) -> list[np.ndarray]:
    """Cut ``order`` greedily into runs within the sample and byte limits."""
    limit = options.max_bytes_per_shard - END_BYTES
    max_samples = options.max_samples_per_shard or len(order) + 1
    boundaries = [0]
    count = total = 0
    for position, size in enumerate(sizes[order].tolist()):
        if count and (count >= max_samples or total + size > limit):
            boundaries.append(position)
            count = total = 0
        if size > limit and warn_oversize:
            logger.warning(
                "sample %d needs %d bytes, more than max_bytes_per_shard=%d: it gets a shard "
                "of its own",
                int(order[position]),
                size + END_BYTES,
                options.max_bytes_per_shard,
            )
        count += 1
        total += size
    boundaries.append(len(order))
    return [order[start:end] for start, end in itertools.pairwise(boundaries) if end > start]


def plan_chunks(table: FileTable, options: BuildOptions) -> list[np.ndarray]:
    """Chunks of table indices, in output order."""
    order = sample_order(len(table), options)
    return cut_chunks(order, sample_tar_sizes(table), options, warn_oversize=not options.reencodes)
