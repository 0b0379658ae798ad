"""A bounded shuffle buffer whose state is a list of sample references, not sample bytes."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from shardstream.streaming.planning.draws import Draws

__all__ = ["ShuffleBuffer"]


class _Source(Protocol):
    def __iter__(self) -> Iterator[tuple[Any, Any]]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...
    def fetch(self, refs: Sequence[Any]) -> list[Any]: ...


class ShuffleBuffer:
    """Stage: shuffle ``(ref, sample)`` pairs through a buffer of ``size`` samples.

    Memory is bounded by ``size`` samples (the encoded bytes, before decoding). The state holds
    the references of the buffered samples; on restore they are re-read through the source's
    ``fetch``, so a resume replays at most ``size`` samples.

    Args:
        source: A stage yielding ``(ref, sample)``, with ``state_dict``, ``load_state_dict``
            and ``fetch``.
        size: Samples held; 0 or 1 passes samples through in order.
        seed: Seed sequence, e.g. ``[seed, epoch, rank, worker]``.

    Example:
        >>> from shardstream.streaming.planning.interleave import Interleave
        >>> source = Interleave([4], lambda p, a, b: iter(range(a, b)), seed=[0])
        >>> sorted(sample for _, sample in ShuffleBuffer(source, size=2, seed=[0]))
        [0, 1, 2, 3]
    """

    def __init__(self, source: _Source, size: int = 1000, seed: Sequence[int] = (0,)) -> None:
        self.source = source
        self._size = max(1, size)
        self._draws = Draws([*seed, 3])
        self._buffer: list[tuple[Any, Any]] = []
        self._restored: list[Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """Buffered references, draw state, and the source's state under ``"source"``."""
        return {
            "buffer": [list(ref) for ref, _ in self._buffer],
            "rng": self._draws.state_dict(),
            "source": self.source.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from a :meth:`state_dict`; buffered samples are re-read on iteration."""
        self.source.load_state_dict(state["source"])
        self._draws.load_state_dict(state["rng"])
        self._restored = [tuple(ref) for ref in state["buffer"]]
        self._buffer = []

    def __iter__(self) -> Iterator[tuple[Any, Any]]:
        if self._restored is not None:
            refs, self._restored = self._restored, None
            self._buffer = list(zip(refs, self.source.fetch(refs), strict=True))
        buffer, size, below = self._buffer, self._size, self._draws.below
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
