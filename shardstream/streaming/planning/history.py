"""What an epoch has left after a restart, at any world size and worker count.

An epoch is read in one or more *passes*. A pass reads a sequence (the whole epoch, or what an
earlier pass left) with a *plan layout* (:class:`~shardstream.streaming.planning.split.Layout`)
and is described by a :class:`PassRecord` once it ends early: the plan layout and the steps
every rank consumed (ranks step together, so the count is the same on every rank).

Which samples those steps held follows from the plan alone (:mod:`.windows`): each stream
consumed whole windows, a prefix of each of its sub-lanes, and then a prefix of one window's
order, a prefix of each of that window's runs. What is left is a
:class:`~.leftover.LeftSequence`: one template of a rank part's leftovers, shared by every
rank, and per rank its partly read windows, built only where a later pass reads them. Its
cost grows with streams x lanes, never with the ranks or the samples.

The next pass plans that list like a whole epoch (equal parts per rank, ``pad``/``drop``), so
every rank again gets the same number of batches. Positions, not samples, are what is left: a
sample that the pass would have read twice (a ``pad`` repeat, a mixture that repeats a small
stream) and that was read once is still left once. A ``mask`` filler is not a position of the
sequence, so it is never left: with ``mask`` every sample comes exactly once across restarts.
"""

from __future__ import annotations

import dataclasses

from shardstream.streaming.planning.leftover import LeftSequence
from shardstream.streaming.planning.order import PlanOptions
from shardstream.streaming.planning.sequence import BaseSequence, PassSequence
from shardstream.streaming.planning.split import Layout, Shape
from shardstream.streaming.planning.windows import StreamId

__all__ = ["PassRecord", "pass_sequence", "remainder"]


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """A finished part of an epoch: its plan layout, and the steps each rank consumed in it."""

    layout: Layout
    consumed_steps: int


def remainder(
    sequence: PassSequence,
    record: PassRecord,
    epoch: int,
    pass_index: int,
    options: PlanOptions,
) -> LeftSequence:
    """What a pass over ``sequence`` left after ``record.consumed_steps`` steps.

    Examples:
        >>> import numpy as np
        >>> from shardstream.streaming.planning.sequence import ShardSequence
        >>> options = PlanOptions(shuffle=False, block_size=2, piece_size=2)
        >>> sequence = ShardSequence(np.array([3, 2]), np.array([0, 1]))
        >>> left = remainder(sequence, PassRecord(Layout(1, 1, 2), 1), 0, 0, options)
        >>> left.length, [tuple(run)[:3] for run in left.locate(0, left.length)]
        (3, [(0, 2, 3), (1, 0, 2)])
    """
    shape = Shape.of(sequence.length, record.layout, options)
    consumed = shape.consumed_samples(record.consumed_steps)
    return LeftSequence(sequence, shape, options, StreamId(epoch, pass_index, 0, 0), consumed)


def pass_sequence(
    base: BaseSequence, epoch: int, history: list[PassRecord], options: PlanOptions
) -> PassSequence:
    """The sequence of the pass that follows ``history`` within ``epoch`` (``base`` if none)."""
    sequence: PassSequence = base
    for index, record in enumerate(history):
        sequence = remainder(sequence, record, epoch, index, options)
    return sequence
