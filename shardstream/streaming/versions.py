"""Which version of a growing dataset a pass reads.

A :class:`~shardstream.streaming.StreamingDataset` opens one version (the newest published
when it is made, or the one pinned with ``version=N``) and reads it in every fresh epoch. A
pass records the version it reads in its state (``dataset_version``), so a job restarted
after the dataset grew finishes the interrupted epoch on the version it began with, exactly,
and the next epoch reads the version the restarted job opened. States saved before versions
existed have no ``dataset_version``: they were saved on version 1 (the only version a dataset
could have then). A mixture's version is the tuple of its streams' versions: a resumed epoch
reads every stream at the version it began with.

Older versions are opened on demand, once per process; a version removed by
``shardstream prune`` cannot be resumed (the error says which and what to do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from shardstream.catalog.shardlist import ShardList, resolve_source
from shardstream.errors import ConfigError, ManifestNotFoundError
from shardstream.format.manifest import Manifest
from shardstream.streaming.epochs import PassCache
from shardstream.streaming.mixture import Mixture, Stream
from shardstream.streaming.resumestate import version_number
from shardstream.streaming.settings import Settings

__all__ = ["DatasetVersion", "VersionNumber", "VersionSet", "reopen"]

#: A dataset's version; a mixture's is the tuple of its streams' versions; None without one.
VersionNumber = int | tuple[int, ...] | None

#: What a state without ``dataset_version`` was saved on (see the module docstring).
LEGACY_VERSION = 1


@dataclasses.dataclass(frozen=True)
class DatasetVersion:
    """One version's shards, manifest (or mixture), and the pass cache built on them.

    ``settings`` are the dataset's, with this version's facts (the default order depends on
    the mean sample size, so each version keeps the order it was read in).
    """

    number: VersionNumber
    shards: ShardList
    manifest: Manifest | None
    passes: PassCache
    settings: Settings
    mixture: Mixture | None = None


class VersionSet:
    """The version a dataset opened, and older ones a resumed pass needs.

    Args:
        source: The dataset's source (a folder or URL with a manifest, or anything else).
        opened: The version opened at construction.
        open_version: Opens another version of ``source`` by number.
    """

    def __init__(
        self,
        source: Any,
        opened: DatasetVersion,
        open_version: Callable[[Any], DatasetVersion],
    ) -> None:
        self.source, self.opened = source, opened
        self._open_version = open_version
        self._older: dict[Any, DatasetVersion] = {}

    def number_for(self, saved: Mapping[str, Any]) -> VersionNumber:
        """The version a saved state's pass reads (``dataset_version``, or the legacy rule)."""
        if "dataset_version" in saved:
            return version_number(saved["dataset_version"])
        opened = self.opened.number
        if isinstance(opened, tuple):
            return (LEGACY_VERSION,) * len(opened)
        return LEGACY_VERSION if opened is not None else None

    def get(self, number: VersionNumber) -> DatasetVersion:
        """Version ``number`` (None: the opened one), opened on first use.

        Raises:
            ConfigError: The version cannot be read (pruned, never published, or the source
                has no versions).
        """
        if number is None or number == self.opened.number:
            return self.opened
        if number not in self._older:
            if self.opened.number is None:
                raise ConfigError(
                    f"{self.source!r} has no manifest versions, but the resume state was saved "
                    f"on version {number} of a dataset; resume with the dataset it was saved on"
                )
            try:
                self._older[number] = self._open_version(number)
            except ManifestNotFoundError as error:
                raise ConfigError(
                    f"cannot resume: the state's epoch reads version {number} of the dataset, "
                    f"which can no longer be read ({error}). Start the epoch over without "
                    "load_state_dict, or restore that version's manifest."
                ) from error
        return self._older[number]


def reopen(
    source: Any, streams: Sequence[Stream], number: VersionNumber, settings: Settings
) -> DatasetVersion:
    """Open ``source`` (or the mixture of ``streams``) at version ``number``."""
    options = settings.options
    if isinstance(number, tuple):
        pinned = [
            dataclasses.replace(stream, version=version)
            for stream, version in zip(streams, number, strict=True)
        ]
        mixture = Mixture(
            pinned, settings.epoch_size, settings.seed, options.storage_options,
            options.read_options,
        )  # fmt: skip
        settings = settings.with_facts(mixture.shards.facts())
        passes = PassCache(mixture.shards, mixture, settings.plan)
        return DatasetVersion(number, mixture.shards, None, passes, settings, mixture)
    _, shards, manifest = resolve_source(
        source, options.storage_options, options.read_options, version=number
    )
    settings = settings.with_facts(shards.facts())
    passes = PassCache(shards, None, settings.plan)
    number = manifest.version if manifest else None
    return DatasetVersion(number, shards, manifest, passes, settings)
