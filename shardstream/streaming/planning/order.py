"""How an epoch's order is chosen from the dataset when the user leaves it to shardstream.

Three numbers fix how mixed an epoch is and what reading it costs (see :mod:`.windows` and
:mod:`.chunkorder`):

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
  real object store), so a piece is at least ``REMOTE_PIECE_BYTES`` of samples, more when shards
  are short: a piece that reaches a shard's end is two reads, so pieces grow until reads average
  ``REMOTE_READ_BYTES`` (see :func:`remote_piece_bytes`), and a multiple of the batch size (so
  the units dealt to worker streams, whole batches, are one piece each). Chunks are two pieces:
  a worker stream's next piece in a lane is then from another place (its units alternate with
  other streams'), while a rank part that starts inside a chunk cuts at most every other piece
  in two. The lanes are as many as ``REMOTE_WINDOW_BYTES`` of pieces hold (32 to 512). With
  chunks and units of four pieces, as before, a lane read on in the same place for four windows,
  so a stretch of the epoch held a quarter of the places: on 200 classes written one per shard,
  one epoch of SGD trained to 0.20 accuracy where a random order reaches 0.32
  (``benchmarks/shuffle.py``'s remote row);
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
    "REMOTE_READ_BYTES",
    "REMOTE_WINDOW_BYTES",
    "DatasetFacts",
    "OrderChoice",
    "choose_open_shards",
    "choose_order",
    "remote_piece_bytes",
]

LOCAL_CHUNK_SIZE = 4
LOCAL_NUM_OPEN = 512
LOCAL_PIECE_SIZE = 8
#: A piece from an object store (a request costs 10-50 ms before its first byte; 1 MiB at a few
#: hundred MB/s costs about as much again, so reads should average at least that).
REMOTE_PIECE_BYTES = 2 << 20
#: What reads from an object store should average, shard ends included (see above).
REMOTE_READ_BYTES = 5 << 18  # 1.25 MiB
#: The longest piece chosen for short shards.
_REMOTE_MAX_PIECE_BYTES = 8 << 20
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
    batch_size: int = 1,
) -> OrderChoice:
    """The order's numbers: those given, the rest chosen from ``facts``.

    A remote piece is a multiple of ``batch_size``: the units dealt to worker streams are
    whole batches, and a unit longer than its piece would cut pieces at chunk ends (two reads).

    Example:
        >>> choose_order(DatasetFacts(indexed=True, local=True, mean_sample_bytes=110e3))
        OrderChoice(chunk_size=4, num_open=512, piece_size=8, block_size=64)
        >>> choose_order(DatasetFacts(True, False, 10e3))
        OrderChoice(chunk_size=420, num_open=127, piece_size=210, block_size=210)
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
        wanted = math.ceil(remote_piece_bytes(facts.mean_shard_bytes) / sample)
        piece = piece_size or min(4096, max(LOCAL_PIECE_SIZE, wanted))
        piece = -(-piece // max(1, batch_size)) * max(1, batch_size) if not piece_size else piece
        lanes = min(LOCAL_NUM_OPEN, max(32, int(REMOTE_WINDOW_BYTES // (piece * sample))))
        chosen = (2 * piece, lanes, piece, piece)
    given = (chunk_size, num_open, piece_size, block_size)
    pairs = zip(chosen, given, strict=True)
    return OrderChoice(*(auto if value is None else value for auto, value in pairs))


def remote_piece_bytes(mean_shard_bytes: float) -> float:
    """Bytes of a remote piece: reads average ``REMOTE_READ_BYTES`` with shard ends counted.

    A piece of ``p`` bytes from shards of ``s`` bytes is cut by a shard end about ``p / s``
    times, so reads average ``1 / (1 / p + 1 / s)`` bytes; ``p`` is the smallest that makes
    that ``REMOTE_READ_BYTES``, at least ``REMOTE_PIECE_BYTES`` and at most 8 MiB.

    Example:
        >>> remote_piece_bytes(64 << 20) == REMOTE_PIECE_BYTES
        True
        >>> round(remote_piece_bytes(2e6) / 2**20, 2)
        3.63
    """
    if mean_shard_bytes <= 0:
        return REMOTE_PIECE_BYTES
    room = 1 / REMOTE_READ_BYTES - 1 / mean_shard_bytes
    if room <= 1 / _REMOTE_MAX_PIECE_BYTES:
        return _REMOTE_MAX_PIECE_BYTES
    return min(_REMOTE_MAX_PIECE_BYTES, max(REMOTE_PIECE_BYTES, 1 / room))


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
