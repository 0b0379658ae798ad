"""A bounded shuffle buffer, for shards of unknown length (no manifest)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from shardstream.streaming.worker.draws import Draws

__all__ = ["ShuffleBuffer"]


class ShuffleBuffer:
    """Stage: shuffle ``(ref, sample)`` pairs through a buffer of ``size`` samples.

    Memory is bounded by ``size`` samples (the encoded bytes, before decoding).

    Args:
        source: A stage yielding ``(ref, sample)``.
        size: Samples held; 0 or 1 passes samples through in order.
        seed: Seed sequence, e.g. ``[seed, epoch, rank, worker]``.

    Example:
        >>> from shardstream.streaming.worker.interleave import Interleave
        >>> source = Interleave([4], lambda p, a, b: iter(range(a, b)), seed=[0])
        >>> sorted(sample for _, sample in ShuffleBuffer(source, size=2, seed=[0]))
        [0, 1, 2, 3]
    """

    def __init__(
        self, source: Iterable[tuple[Any, Any]], size: int = 1000, seed: Sequence[int] = (0,)
    ) -> None:
        self.source = source
        self._size = max(1, size)
        self._draws = Draws([*seed, 3])

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        buffer: list[tuple[Any, Any]] = []
        size, below = self._size, self._draws.below
        for item in self.source:
            if len(buffer) < size:
                buffer.append(item)
                continue
            pick = below(size)
            out, buffer[pick] = buffer[pick], item
            yield out
        while buffer:
            pick = below(len(buffer))
            buffer[pick], buffer[-1] = buffer[-1], buffer[pick]
            yield buffer.pop()
