"""Reading several shards of unknown length at once, drawing each next sample from a random one.

For shards without counts (see :mod:`.wholeshardpass`): a single stream through a shard
written in class order yields one class for a long time, and a shuffle buffer only mixes what it
holds. Keeping ``num_open`` shards open and drawing each next sample from a random one puts up to
``num_open`` classes in flight at any moment, with memory bounded by ``num_open`` open streams.
Counted datasets need none of this: their order is planned in closed form
(:mod:`shardstream.streaming.planning.windows`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from shardstream.streaming.worker.draws import Draws

__all__ = ["Interleave", "Ref"]

#: Identifies one sample of an epoch plan: (piece number, ordinal within the piece).
Ref = tuple[int, int]
PieceOpener = Callable[[int, int, int], Iterator[Any]]
_END = object()


class Interleave:
    """Stage: yield ``(ref, sample)`` from up to ``num_open`` pieces at once, chosen at random.

    Args:
        lengths: Samples in each piece, in plan order; None where unknown (no manifest), in
            which case the piece ends when its stream does.
        open_piece: ``open_piece(piece, start, stop)`` yields samples ``start..stop-1`` of a
            piece (``stop`` is -1 when the length is unknown: read to the end).
        num_open: Pieces read at the same time (1 reads them one after another).
        seed: Seed sequence for the opening order and the draws, e.g. ``[seed, epoch, rank,
            worker]``.
        shuffle: Open pieces in a random order; with False, ``num_open`` is forced to 1.

    Example:
        >>> stage = Interleave([2, 2], lambda p, a, b: iter(range(a, b)), num_open=2, seed=[0])
        >>> sorted(ref for ref, _ in stage)
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    """

    def __init__(
        self,
        lengths: Sequence[int | None],
        open_piece: PieceOpener,
        num_open: int = 8,
        seed: Sequence[int] = (0,),
        shuffle: bool = True,
    ) -> None:
        self._lengths = list(lengths)
        self._open_piece = open_piece
        self._num_open = max(1, num_open) if shuffle else 1
        order_rng = np.random.default_rng([*seed, 1])
        self._order = (
            order_rng.permutation(len(lengths)).tolist() if shuffle else list(range(len(lengths)))
        )
        self._draws = Draws([*seed, 2])
        self._next = 0
        self._open: list[list[int]] = []  # [piece, samples already yielded]

    def _start(self, piece: int, done: int) -> Iterator[Any]:
        length = self._lengths[piece]
        return self._open_piece(piece, done, -1 if length is None else length)

    def __iter__(self) -> Iterator[tuple[Ref, Any]]:
        opened, lengths, below = self._open, self._lengths, self._draws.below
        streams = [self._start(p, done) for p, done in opened]
        try:
            while True:
                if len(opened) < self._num_open and self._next < len(self._order):
                    self._fill(opened, streams)
                if not opened:
                    return
                pick = below(len(opened)) if len(opened) > 1 else 0
                entry = opened[pick]
                sample = next(streams[pick], _END)
                if sample is _END:  # only for unknown lengths: known ones raise when short
                    del opened[pick]
                    _close(streams.pop(pick))
                    continue
                ref = (entry[0], entry[1])
                entry[1] += 1
                length = lengths[entry[0]]
                if length is not None and entry[1] >= length:
                    del opened[pick]
                    _close(streams.pop(pick))
                yield ref, sample
        finally:
            for stream in streams:
                _close(stream)

    def _fill(self, opened: list[list[int]], streams: list[Iterator[Any]]) -> None:
        """Open the next pieces in order until ``num_open`` are open (empty ones skipped)."""
        while len(opened) < self._num_open and self._next < len(self._order):
            piece = self._order[self._next]
            self._next += 1
            if self._lengths[piece] != 0:
                opened.append([piece, 0])
                streams.append(self._start(piece, 0))


def _close(stream: Iterator[Any]) -> None:
    close = getattr(stream, "close", None)
    if callable(close):
        close()
