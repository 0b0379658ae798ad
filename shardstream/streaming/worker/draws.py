"""Seeded uniform integer draws, cheap enough to make one per sample. Torch-free.

``numpy.random.Generator.integers(n)`` costs a few microseconds per call, which is a visible
share of reading a raw sample. :class:`Draws` makes one numpy call per block of 1024 uniform
floats and turns each into ``int(u * n)`` (a bias below 1e-9 for any ``n`` a shuffle uses).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["Draws"]

BLOCK = 1024


class Draws:
    """Uniform draws in ``[0, n)`` from a seed sequence.

    Example:
        >>> draws = Draws([0, 1])
        >>> picks = [draws.below(10) for _ in range(5)]
        >>> all(0 <= pick < 10 for pick in picks)
        True
    """

    def __init__(self, seed: Sequence[int]) -> None:
        self._rng = np.random.default_rng(list(seed))
        self._block: list[float] = []
        self._used = 0

    def below(self, n: int) -> int:
        """One draw in ``[0, n)``."""
        if self._used == len(self._block):
            self._block = self._rng.random(BLOCK).tolist()
            self._used = 0
        value = self._block[self._used]
        self._used += 1
        return int(value * n)
