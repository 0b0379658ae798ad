"""What a pass's plan costs to compute, kept per process: the epoch's shard order and the
sequences of its passes (restores ask for the same pass repeatedly)."""

from __future__ import annotations

from shardstream.catalog.shardlist import ShardList
from shardstream.storage.processlocal import ProcessLock
from shardstream.streaming.mixture import Mixture
from shardstream.streaming.planning.history import PassRecord, pass_sequence
from shardstream.streaming.planning.order import PlanOptions, epoch_sequence
from shardstream.streaming.planning.schedule import PassPlan
from shardstream.streaming.planning.sequence import BaseSequence, PassSequence
from shardstream.streaming.planning.split import Layout, Shape

__all__ = ["PlanCache"]


class PlanCache:
    """The latest epoch's sequence and passes, computed once per process and epoch.

    Args:
        shards: The dataset's shards (their counts).
        mixture: The mixture, if the dataset is one.
        options: The plan options.
    """

    def __init__(self, shards: ShardList, mixture: Mixture | None, options: PlanOptions) -> None:
        self._shards, self._mixture, self._options = shards, mixture, options
        self._length: int | None = None
        self._base: tuple[int, BaseSequence] | None = None
        self._passes: dict[tuple[int, tuple[PassRecord, ...]], PassSequence] = {}
        # The worker threads of a thread loader (and the training thread, planning the next
        # epoch as a pass ends) ask at once: one answer is never another epoch's.
        self._lock = ProcessLock()

    def epoch_length(self) -> int:
        """Samples in a fresh epoch of a single dataset."""
        if self._length is None:
            self._length = self._shards.total_samples()
        return self._length

    def base(self, epoch: int) -> BaseSequence:
        """A fresh ``epoch``'s sequence: the epoch's chunks or shards in order, or the mixture's."""
        with self._lock:
            return self._base_of(epoch)

    def _base_of(self, epoch: int) -> BaseSequence:
        if self._base is None or self._base[0] != epoch:
            sequence: BaseSequence
            if self._mixture is not None:
                sequence = self._mixture.epoch_sequence(epoch, self._options)
            else:
                options = self._options
                sequence = epoch_sequence(self._shards.counts(), options.seed, epoch, options)
            self._base = (epoch, sequence)
        return self._base[1]

    def sequence(self, epoch: int, history: tuple[PassRecord, ...]) -> PassSequence:
        """The sequence of the pass after ``history`` (kept: restores ask for it repeatedly)."""
        key = (epoch, history)
        with self._lock:
            found = self._passes.get(key)
            if found is None:
                base = self._base_of(epoch)
                found = pass_sequence(base, epoch, list(history), self._options)
                self._passes = {key: found}
            return found

    def shape(self, length: int, layout: Layout) -> Shape:
        """The integer layout of a pass over ``length`` samples."""
        return Shape.of(length, layout, self._options)

    def plan(self, epoch: int, history: tuple[PassRecord, ...], layout: Layout) -> PassPlan:
        """The pass after ``history`` in ``epoch``, planned for ``layout``."""
        sequence = self.sequence(epoch, history)
        shape = self.shape(sequence.length, layout)
        return PassPlan(sequence, shape, self._options, epoch, len(history))
