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
from collections.abc import Mapping, Sequence
from typing import Any, cast

from shardstream.catalog.shardlist import ShardList, Source, resolve_source
from shardstream.errors import ConfigError, ManifestNotFoundError
from shardstream.format.manifest import Manifest
from shardstream.streaming.control.cache import PassCache
from shardstream.streaming.control.state import VersionNumber, version_number
from shardstream.streaming.mixture import Mixture, Stream
from shardstream.streaming.settings import Settings

__all__ = ["DatasetVersion", "VersionNumber", "VersionSet", "open_version"]

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


def open_version(
    source: Source | Stream | Sequence[Stream], settings: Settings, version: int | None
) -> DatasetVersion:
    """Open a dataset's ``source`` (a mixture of :class:`Stream` too) at ``version``.

    Args:
        source: What :class:`~shardstream.streaming.StreamingDataset` was given.
        settings: The dataset's settings (facts are added from the opened version).
        version: The version to read, None for the newest published.

    Raises:
        ConfigError: A mixture mixes ``Stream`` items with others, or is given ``version``
            (it pins versions per stream), or ``epoch_size`` is given without a mixture.
    """
    streams = _streams_of(source)
    if streams is not None:
        if version is not None:
            raise ConfigError("a mixture pins versions per stream: Stream(..., version=N)")
        return _open_mixture(streams, settings, None)
    if settings.epoch_size is not None:
        raise ConfigError("epoch_size is for mixtures of Stream(...) sources")
    return _open_single(cast(Source, source), settings, version)


def _streams_of(source: Any) -> list[Stream] | None:
    """The streams of a mixture, or None when ``source`` is not one."""
    streams = [source] if isinstance(source, Stream) else source
    if not isinstance(streams, (list, tuple)) or not any(isinstance(s, Stream) for s in streams):
        return None
    if not all(isinstance(item, Stream) for item in streams):
        raise ConfigError("a mixture takes Stream(...) items only; wrap every source")
    return [cast(Stream, stream) for stream in streams]


def _open_mixture(
    streams: Sequence[Stream], settings: Settings, number: tuple[int, ...] | None
) -> DatasetVersion:
    """A mixture of ``streams`` (pinned to ``number``, the streams' versions, if given)."""
    if number is not None:
        streams = [
            dataclasses.replace(stream, version=version)
            for stream, version in zip(streams, number, strict=True)
        ]
    options = settings.options
    mixture = Mixture(
        streams, settings.epoch_size, settings.seed, options.storage_options,
        options.read_options,
    )  # fmt: skip
    settings = settings.with_facts(mixture.shards.facts())
    passes = PassCache(mixture.shards, mixture, settings.plan)
    number = mixture.versions if number is None else number
    return DatasetVersion(number, mixture.shards, None, passes, settings, mixture)


def _open_single(source: Source, settings: Settings, version: int | None) -> DatasetVersion:
    options = settings.options
    _, shards, manifest = resolve_source(
        source, options.storage_options, options.read_options, version
    )
    settings = settings.with_facts(shards.facts())
    passes = PassCache(shards, None, settings.plan)
    number = manifest.version if manifest else None
    return DatasetVersion(number, shards, manifest, passes, settings)


class VersionSet:
    """The version a dataset opened, and older ones a resumed pass needs.

    Args:
        source: The dataset's source (a folder or URL with a manifest, a mixture's streams, or
            anything else).
        opened: The version opened at construction.
    """

    def __init__(self, source: Any, opened: DatasetVersion) -> None:
        self.source, self.opened = source, opened
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
                self._older[number] = self._reopen(number)
            except ManifestNotFoundError as error:
                raise ConfigError(
                    f"cannot resume: the state's epoch reads version {number} of the dataset, "
                    f"which can no longer be read ({error}). Start the epoch over without "
                    "load_state_dict, or restore that version's manifest."
                ) from error
        return self._older[number]

    def _reopen(self, number: int | tuple[int, ...]) -> DatasetVersion:
        settings = self.opened.settings
        if isinstance(number, tuple):
            return _open_mixture(_streams_of(self.source) or [], settings, number)
        return _open_single(self.source, settings, number)
