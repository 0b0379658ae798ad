"""What pass control needs of a dataset, as one small object (pass control never imports it).

A :class:`~shardstream.streaming.StreamingDataset` makes one :class:`PassInputs` from its
opened versions and the channel to its workers; the pass, the dataset's per-worker state and
the loader's position are all computed from it and a
:class:`~shardstream.streaming.control.context.Context`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from shardstream.streaming.control.channel import EpochChannel
from shardstream.streaming.control.context import Context
from shardstream.streaming.control.resumestate import (
    PassState,
    SavedState,
    VersionNumber,
    check_fingerprint,
    check_layout,
)
from shardstream.streaming.control.versionset import DatasetVersion, VersionSet
from shardstream.streaming.planning.schedule import PassPlan
from shardstream.streaming.planning.split import Layout
from shardstream.streaming.settings import Settings

__all__ = ["PassInputs"]


@dataclasses.dataclass(frozen=True)
class PassInputs:
    """A dataset's versions (with their settings and plans) and its channel to the workers.

    Attributes:
        versions: The opened version and older ones a resumed pass reads.
        channel: The epoch channel shared with the DataLoader workers.
    """

    versions: VersionSet
    channel: EpochChannel

    @property
    def opened(self) -> DatasetVersion:
        """The version the dataset opened (fresh epochs read it)."""
        return self.versions.opened

    @property
    def fresh_version(self) -> VersionNumber:
        """The version a fresh epoch reads: the one the training process settled on."""
        version = self.channel.version
        return self.opened.number if version is None else version

    @property
    def settings(self) -> Settings:
        """The dataset's settings, with the opened version's facts."""
        return self.opened.settings

    @property
    def counted(self) -> bool:
        """Whether sample counts are known (a manifest, or a mixture of datasets with them)."""
        return self.opened.shards.counted

    def layout(self, context: Context, num_workers: int | None = None) -> Layout:
        """The rank's physical layout (``num_workers``: default the context's)."""
        workers = context.num_workers if num_workers is None else max(1, num_workers)
        return Layout(context.world_size, workers, self.settings.micro_batch)

    def plan(self, state: PassState, physical: Layout) -> PassPlan:
        """The pass ``state`` describes (its plan layout, or a fresh one for ``physical``)."""
        layout = state.plan or self.settings.plan_layout(physical)
        plans = self.versions.get(state.dataset_version).plans
        return plans.plan(state.epoch, state.history, layout)

    def epoch_samples(self) -> int:
        """Samples in a fresh epoch over all ranks.

        Raises:
            TypeError: The counts are unknown (no ``len()``).
        """
        if not self.counted:
            raise TypeError(
                "this StreamingDataset has no manifest (it reads a shard pattern or URL list), "
                "so its length is unknown; run `shardstream index` on the shards (or build them "
                "with shardstream) for len(), equal per-rank counts and exact epochs"
            )
        opened = self.opened
        return opened.mixture.epoch_size if opened.mixture else opened.plans.epoch_length()

    def fingerprint(self, version: VersionNumber = None) -> dict[str, Any]:
        """The settings and dataset facts that fix which samples an epoch holds, in order.

        ``version``: of that version of the dataset (None: the opened one).
        """
        opened = self.versions.get(version)
        options = self.settings.options
        return {
            **opened.settings.fingerprint(),
            "num_shards": len(opened.shards),
            "num_samples": opened.manifest.num_samples if opened.manifest else None,
            "mixture": opened.mixture.fingerprint() if opened.mixture else None,
            "canonical": [options.canonical_ranks, options.canonical_workers],
        }

    def check_state(
        self, saved: SavedState, current: Layout, *, elastic: bool, allow_new_batch_size: bool
    ) -> VersionNumber:
        """Refuse a saved state this dataset cannot continue; the version its pass reads.

        Raises:
            ConfigError: An order-fixing setting or the layout changed in a way the caller
                cannot follow (names the field).
        """
        number = self.versions.number_for(saved)
        check_fingerprint(saved.fingerprint, self.fingerprint(number))
        check_layout(
            saved.layout, current, elastic=elastic, allow_new_batch_size=allow_new_batch_size
        )
        return number
