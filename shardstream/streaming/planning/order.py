"""How an epoch's order is chosen from the dataset when the user leaves it to shardstream.

Three numbers fix how mixed an epoch is and what reading it costs (see :mod:`.windows` and
:mod:`.chunks`):

- ``chunk_size``: the epoch is read in chunks of this many consecutive samples, each from a
  random place of the dataset (0: whole shards in a shuffled order). Smaller chunks mix more
  evenly: a window of ``w`` samples holds ``w / chunk_size`` random places, and how unevenly the
  classes are represented in it (for as many steps as it lasts) grows with the square root of
  ``chunk_size``;
- ``num_open``: the lanes a worker stream reads from at once; a batch holds samples from about
  as many places as ``min(batch, num_open)``, so it must be well above the batch size for
  batches as mixed as a random permutation's;
- ``piece_size``: samples a stream reads from each lane per window (one read or one memory map
  each), so a window holds about ``num_open * piece_size`` samples.

The choice depends on what a read costs:

- **local shards with an index** are memory-mapped or read with ``readinto``: a short run
  costs about 10 us, so chunks are 4 samples, pieces 8 (two chunks) and lanes 512: a window of
  about 4,096 samples from about 1,000 places. On 200 classes written one per shard, one epoch
  of SGD trains within 0.01 of a random permutation's accuracy (``benchmarks/shuffle.py``);
  chunks of 8 were within 0.015, at about 10% less CPU per sample;
- **remote shards with an index** cost a request per run (10-50 ms to the first byte on a
  real object store), so a piece is ``REMOTE_PIECE_BYTES`` of samples, and chunks and the units
  dealt to worker streams (``block_size``) are four pieces: a piece then crosses a chunk or unit
  boundary (which splits it into two reads from different places) about half the time, so reads
  average over 1 MiB. The lanes are as many as ``REMOTE_WINDOW_BYTES`` of pieces hold (32 to
  512);
- **shards without an index** cannot be entered in the middle cheaply: whole shards in a
  shuffled order, 64 lanes of 64 samples (the order of earlier releases).

Values the user sets are kept as they are.
"""

from __future__ import annotations

import dataclasses
import math

from shardstream.catalog.facts import DatasetFacts

__all__ = [
    "LOCAL_CHUNK_SIZE",
    "LOCAL_NUM_OPEN",
    "LOCAL_PIECE_SIZE",
    "REMOTE_PIECE_BYTES",
    "REMOTE_WINDOW_BYTES",
    "DatasetFacts",
    "OrderChoice",
    "choose_open_shards",
    "choose_order",
]

LOCAL_CHUNK_SIZE = 4
LOCAL_NUM_OPEN = 512
LOCAL_PIECE_SIZE = 8
#: A piece from an object store (a request costs 10-50 ms before its first byte; 1 MiB at a few
#: hundred MB/s costs about as much again, so reads should average at least that).
REMOTE_PIECE_BYTES = 2 << 20
#: About what one worker stream's window holds in memory when reading remote shards.
REMOTE_WINDOW_BYTES = 256 << 20
_LOCAL_BLOCK_SIZE = 64
_UNINDEXED = (0, 64, 64, 64)  # (chunk_size, num_open, piece_size, block_size): whole shards
#: Shards read at once by a worker without a manifest: each is an open stream (a file, or a
#: remote stream with its read-ahead), so remote ones are fewer.
_OPEN_SHARDS_LOCAL = 256
_OPEN_SHARDS_REMOTE = 64


@dataclasses.dataclass(frozen=True)
class OrderChoice:
    """The resolved ``chunk_size``, ``num_open``, ``piece_size`` and ``block_size``."""

    chunk_size: int
    num_open: int
    piece_size: int
    block_size: int = _LOCAL_BLOCK_SIZE


def choose_order(
    facts: DatasetFacts,
    chunk_size: int | None = None,
    num_open: int | None = None,
    piece_size: int | None = None,
    block_size: int | None = None,
) -> OrderChoice:
    """The order's numbers: those given, the rest chosen from ``facts``.

    Example:
        >>> choose_order(DatasetFacts(indexed=True, local=True, mean_sample_bytes=110e3))
        OrderChoice(chunk_size=4, num_open=512, piece_size=8, block_size=64)
        >>> choose_order(DatasetFacts(True, False, 10e3))
        OrderChoice(chunk_size=840, num_open=127, piece_size=210, block_size=840)
        >>> choose_order(DatasetFacts(False, True, 0.0), num_open=16)
        OrderChoice(chunk_size=0, num_open=16, piece_size=64, block_size=64)
    """
    chosen: tuple[int, int, int, int]
    if not facts.indexed:
        chosen = _UNINDEXED
    elif facts.local:
        chosen = (LOCAL_CHUNK_SIZE, LOCAL_NUM_OPEN, LOCAL_PIECE_SIZE, _LOCAL_BLOCK_SIZE)
    else:
        sample = max(1.0, facts.mean_sample_bytes)
        wanted = math.ceil(REMOTE_PIECE_BYTES / sample)
        piece = piece_size or min(4096, max(LOCAL_PIECE_SIZE, wanted))
        lanes = min(LOCAL_NUM_OPEN, max(32, int(REMOTE_WINDOW_BYTES // (piece * sample))))
        chosen = (4 * piece, lanes, piece, 4 * piece)
    given = (chunk_size, num_open, piece_size, block_size)
    pairs = zip(chosen, given, strict=True)
    return OrderChoice(*(auto if value is None else value for auto, value in pairs))


def choose_open_shards(facts: DatasetFacts, num_open: int | None = None) -> int:
    """Shards a worker reads at once when there is no manifest (``num_open`` if given).

    A worker without a manifest reads whole shards, each next sample from a random open one,
    so a batch holds samples of at most this many shards: many locally (an open file costs a
    descriptor and a small buffer), fewer remotely (each holds a stream and its read-ahead).

    Example:
        >>> choose_open_shards(DatasetFacts(False, True, 0.0))
        256
    """
    if num_open is not None:
        return num_open
    return _OPEN_SHARDS_LOCAL if facts.local else _OPEN_SHARDS_REMOTE
