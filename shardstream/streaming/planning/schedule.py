"""Which steps a DataLoader worker serves, and which stream slices each step reads.

A pass is planned for a *plan layout* (:class:`~.split.Layout`: ``W`` ranks, ``N`` streams per
rank, micro-batch ``b``). It is read by a *physical layout*: ``W'`` ranks with ``N'``
DataLoader workers each, where ``W'`` divides ``W``. Physical rank ``r`` reads plan ranks
``r * W / W'`` up to the next rank's, so each of its batches is the concatenation of those plan
ranks' micro-batches of one step, and the ranks' batches of one step together are the plan's
global batch, whatever ``W'`` (the same global batches at any world size).

A DataLoader asks its workers in turn, so the ``i``-th batch of a pass that starts at step
``T0`` is served by worker ``i % N'``: worker ``w`` serves steps ``T0 + w, T0 + w + N', ...``.
Every step is a closed-form slice of its streams (:mod:`.windows`), so which worker serves it
only decides who reads it: with ``N'`` dividing ``N`` each worker reads its own streams front
to back, except for a few steps at the end of an epoch.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterator

from shardstream.errors import ConfigError
from shardstream.streaming.planning.order import PlanOptions
from shardstream.streaming.planning.sequence import PassSequence
from shardstream.streaming.planning.split import Layout, Shape

__all__ = ["PassPlan", "StepRead", "plan_ranks", "steps_of_worker"]


@dataclasses.dataclass(frozen=True)
class PassPlan:
    """One pass: what it reads, how it is laid out, and where it sits in its epoch.

    Attributes:
        sequence: The pass's samples in order.
        shape: The integer layout for the plan layout.
        options: Seed, shuffle, policy and sizes.
        epoch: The epoch.
        pass_index: Passes of this epoch before this one.
    """

    sequence: PassSequence
    shape: Shape
    options: PlanOptions
    epoch: int
    pass_index: int

    @property
    def layout(self) -> Layout:
        """The plan layout."""
        return self.shape.layout

    @property
    def steps(self) -> int:
        """Batches every rank yields in the pass."""
        return self.shape.steps


@dataclasses.dataclass(frozen=True)
class StepRead:
    """Positions ``[start, stop)`` of stream ``phase`` of plan rank ``rank``."""

    rank: int
    phase: int
    start: int
    stop: int


def plan_ranks(plan_world_size: int, world_size: int, rank: int) -> range:
    """The plan ranks that physical ``rank`` of ``world_size`` reads.

    Raises:
        ConfigError: ``world_size`` does not divide the plan's world size.
    """
    if plan_world_size % world_size:
        raise ConfigError(
            f"a pass planned for {plan_world_size} ranks cannot be read by {world_size} ranks "
            "(the world size must divide it)"
        )
    share = plan_world_size // world_size
    return range(rank * share, (rank + 1) * share)


def steps_of_worker(
    shape: Shape, first: int, worker: int, num_workers: int, ranks: range
) -> Iterator[tuple[int, list[StepRead]]]:
    """The steps worker ``worker`` of ``num_workers`` serves from step ``first`` on, with reads.

    Examples:
        >>> shape = Shape.of(40, Layout(1, 2, 4), PlanOptions(block_size=4))
        >>> [(step, [(r.phase, r.start) for r in reads])
        ...  for step, reads in steps_of_worker(shape, 0, 1, 2, range(1))][:3]
        [(1, [(1, 0)]), (3, [(1, 4)]), (5, [(1, 8)])]
    """
    batches = shape.stream_batches.tolist()
    descending = [-count for count in batches]  # ascending, for bisect
    samples, batch = shape.stream_samples.tolist(), shape.layout.batch_size
    step = first + worker
    if step >= shape.steps:
        return
    index, round_ = shape.step(step)
    while step < shape.steps:
        start = round_ * batch
        stop = min(start + batch, samples[index])
        yield step, [StepRead(rank, index, start, stop) for rank in ranks]
        step, index = step + num_workers, index + num_workers
        active = bisect.bisect_left(descending, -round_)  # streams with > round_ batches
        while index >= active and step < shape.steps:
            index -= active
            round_ += 1
            active = bisect.bisect_left(descending, -round_)
