"""How an epoch's order is chosen from the dataset when the user leaves it to shardstream.

Three numbers fix how mixed an epoch is and what reading it costs (see :mod:`.windows` and
:mod:`.chunks`):

- ``chunk_size``: the epoch is read in chunks of this many consecutive samples, each from a
  random place of the dataset (0: whole shards in a shuffled order);
- ``num_open``: the lanes a worker stream reads from at once; a batch holds samples from about
  as many places as ``min(batch, num_open)``, so it must be well above the batch size for
  batches as mixed as a random permutation's;
- ``piece_size``: samples a stream reads from each lane per window (one read or one memory map
  each), so a window holds about ``num_open * piece_size`` samples.

The choice depends on what a read costs:

- **local shards with an index** are memory-mapped or read with ``readinto``: a short piece
  costs a few microseconds, so pieces are short and lanes many (512 lanes x 8 samples: a
  window of 4,096 samples, as many as the shuffle buffers of the peers hold);
- **remote shards with an index** cost a request per piece (10-50 ms to the first byte on a
  real object store), so a piece is at least ``MIN_REMOTE_READ_BYTES`` and the lanes are as
  many as ``REMOTE_WINDOW_BYTES`` of such pieces hold (32 to 512);
- **shards without an index** cannot be entered in the middle cheaply: whole shards in a
  shuffled order, 64 lanes of 64 samples (the order of earlier releases).

Values the user sets are kept as they are.
"""

from __future__ import annotations

import dataclasses
import math

__all__ = [
    "LOCAL_CHUNK_SIZE",
    "LOCAL_NUM_OPEN",
    "LOCAL_PIECE_SIZE",
    "MIN_REMOTE_READ_BYTES",
    "REMOTE_WINDOW_BYTES",
    "DatasetFacts",
    "OrderChoice",
    "choose_open_shards",
    "choose_order",
]

LOCAL_CHUNK_SIZE = 64
LOCAL_NUM_OPEN = 512
LOCAL_PIECE_SIZE = 8
#: The smallest ranged read from an object store that the defaults make (a request costs
#: 10-50 ms before its first byte; 1 MiB at a few hundred MB/s costs about as much again).
MIN_REMOTE_READ_BYTES = 1 << 20
#: About what one worker stream's window holds in memory when reading remote shards.
REMOTE_WINDOW_BYTES = 128 << 20
_UNINDEXED = (0, 64, 64)  # (chunk_size, num_open, piece_size): whole shards
#: Shards read at once by a worker without a manifest: each is an open stream (a file, or a
#: remote stream with its read-ahead), so remote ones are fewer.
_OPEN_SHARDS_LOCAL = 256
_OPEN_SHARDS_REMOTE = 64


@dataclasses.dataclass(frozen=True)
class DatasetFacts:
    """What the default order depends on, known to every rank from the manifest.

    Attributes:
        indexed: Every shard has a per-sample byte index (pieces can start anywhere).
        local: Every shard is on a local file system (no request per read).
        mean_sample_bytes: Average bytes per sample (shard bytes / samples), 0 if unknown.
    """

    indexed: bool
    local: bool
    mean_sample_bytes: float


@dataclasses.dataclass(frozen=True)
class OrderChoice:
    """The resolved ``chunk_size``, ``num_open`` and ``piece_size``."""

    chunk_size: int
    num_open: int
    piece_size: int


def choose_order(
    facts: DatasetFacts,
    chunk_size: int | None = None,
    num_open: int | None = None,
    piece_size: int | None = None,
) -> OrderChoice:
    """The order's three numbers: those given, the rest chosen from ``facts``.

    Example:
        >>> choose_order(DatasetFacts(indexed=True, local=True, mean_sample_bytes=110e3))
        OrderChoice(chunk_size=64, num_open=512, piece_size=8)
        >>> choose_order(DatasetFacts(True, False, 10e3))
        OrderChoice(chunk_size=105, num_open=127, piece_size=105)
        >>> choose_order(DatasetFacts(False, True, 0.0), num_open=16)
        OrderChoice(chunk_size=0, num_open=16, piece_size=64)
    """
    if not facts.indexed:
        chosen = _UNINDEXED
    elif facts.local:
        chosen = (LOCAL_CHUNK_SIZE, LOCAL_NUM_OPEN, LOCAL_PIECE_SIZE)
    else:
        sample = max(1.0, facts.mean_sample_bytes)
        wanted = math.ceil(MIN_REMOTE_READ_BYTES / sample)
        piece = piece_size or min(4096, max(LOCAL_PIECE_SIZE, wanted))
        lanes = min(LOCAL_NUM_OPEN, max(32, int(REMOTE_WINDOW_BYTES // (piece * sample))))
        chosen = (max(LOCAL_CHUNK_SIZE, piece), lanes, piece)  # a chunk holds a whole piece
    return OrderChoice(
        chosen[0] if chunk_size is None else chunk_size,
        chosen[1] if num_open is None else num_open,
        chosen[2] if piece_size is None else piece_size,
    )


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
