"""Which version of a growing dataset a pass reads.

A :class:`~shardstream.streaming.StreamingDataset` opens one version (the newest published
when it is made, or the one pinned with ``version=N``) and reads it in every fresh epoch; under
torch.distributed every rank reads the one the job's first rank to make it opened, and the job
may move on to newer versions between epochs (see
:mod:`shardstream.streaming.control.agreement`). A pass records the version it reads in its
state (``dataset_version``), so a job restarted after the dataset grew finishes the
interrupted epoch on the version it began with, exactly, and the next epoch reads the version
the restarted job opened. States saved before versions existed have no ``dataset_version``:
they were saved on version 1 (the only version a dataset could have then). A mixture's version
is the tuple of its streams' versions: a resumed epoch reads every stream at the version it
began with.

Other versions are opened on demand, once per process (a few are kept); a version removed by
``shardstream prune`` cannot be resumed (the error says which and what to do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, cast

from shardstream.catalog.shardlist import ShardList, Source, resolve_source
from shardstream.errors import ConfigError, ManifestNotFoundError
from shardstream.format.manifest import Manifest
from shardstream.streaming.control.plancache import PlanCache
from shardstream.streaming.control.resumestate import SavedState, VersionNumber
from shardstream.streaming.mixture import Mixture, Stream
from shardstream.streaming.settings import Settings

__all__ = ["DatasetVersion", "VersionNumber", "VersionSet", "open_version", "streams_of"]

#: What a state without ``dataset_version`` was saved on (see the module docstring).
LEGACY_VERSION = 1
#: Versions other than the opened one a process keeps open (each holds its shard table).
_KEPT_VERSIONS = 2


@dataclasses.dataclass(frozen=True)
class DatasetVersion:
    """One version's shards, manifest (or mixture), and the plan cache built on them.

    ``settings`` are the dataset's, with this version's facts (the default order depends on
    the mean sample size, so each version keeps the order it was read in).
    """

    number: VersionNumber
    shards: ShardList
    manifest: Manifest | None
    plans: PlanCache
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
            (it pins versions per stream), or ``epoch_size`` is given without a mixture, or
            ``follow_versions`` is set with ``version`` or with ranks given explicitly.
    """
    _check_follow(settings, version)
    streams = streams_of(source)
    if streams is not None:
        if version is not None:
            raise ConfigError("a mixture pins versions per stream: Stream(..., version=N)")
        return _open_mixture(streams, settings, None)
    if settings.epoch_size is not None:
        raise ConfigError("epoch_size is for mixtures of Stream(...) sources")
    return _open_single(cast(Source, source), settings, version)


def _check_follow(settings: Settings, version: int | None) -> None:
    options = settings.options
    if not options.follow_versions:
        return
    if version is not None:
        raise ConfigError(
            f"version={version} pins a version and follow_versions=True moves to the newest "
            "at each epoch; pass one of them"
        )
    if options.world_size is not None and options.world_size > 1:
        raise ConfigError(
            "follow_versions=True moves every rank to the same version through "
            "torch.distributed, but the ranks were given with rank=/world_size=; pin "
            "version=N on every rank instead (and make new datasets to move on)"
        )


def streams_of(source: Any) -> list[Stream] | None:
    """The streams of a mixture, or None when ``source`` is not one.

    Raises:
        ConfigError: A list mixes ``Stream`` items with others.
    """
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
    plans = PlanCache(mixture.shards, mixture, settings.plan)
    number = mixture.versions if number is None else number
    return DatasetVersion(number, mixture.shards, None, plans, settings, mixture)


def _open_single(source: Source, settings: Settings, version: int | None) -> DatasetVersion:
    options = settings.options
    _, shards, manifest = resolve_source(
        source, options.storage_options, options.read_options, version
    )
    settings = settings.with_facts(shards.facts())
    plans = PlanCache(shards, None, settings.plan)
    number = manifest.version if manifest else None
    return DatasetVersion(number, shards, manifest, plans, settings)


class VersionSet:
    """The version fresh epochs read (``opened``), and others a resumed pass needs.

    Args:
        source: The dataset's source (a folder or URL with a manifest, a mixture's streams, or
            anything else).
        opened: The version opened at construction.
        pinned: ``opened`` was asked for by number (``version=N``): it never moves.
    """

    def __init__(self, source: Any, opened: DatasetVersion, pinned: bool = False) -> None:
        self.source, self.opened, self.pinned = source, opened, pinned
        self._others: dict[Any, DatasetVersion] = {}

    def number_for(self, saved: SavedState) -> VersionNumber:
        """The version a saved state's pass reads (``dataset_version``, or the legacy rule)."""
        if saved.versioned:
            return saved.state.dataset_version
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
        if number not in self._others:
            if self.opened.number is None:
                raise ConfigError(
                    f"{self.source!r} has no manifest versions, but the resume state was saved "
                    f"on version {number} of a dataset; resume with the dataset it was saved on"
                )
            try:
                self._keep(self._reopen(number))
            except ManifestNotFoundError as error:
                raise ConfigError(
                    f"cannot resume: the state's epoch reads version {number} of the dataset, "
                    f"which can no longer be read ({error}). Start the epoch over without "
                    "load_state_dict, or restore that version's manifest."
                ) from error
        return self._others[number]

    def other(self, number: int | tuple[int, ...]) -> DatasetVersion:
        """Version ``number``, kept or opened now.

        Raises:
            ManifestNotFoundError: No such version (pruned, or never published).
        """
        return self._others.pop(number, None) or self._reopen(number)

    def move_to(self, version: DatasetVersion) -> None:
        """Read ``version`` in fresh epochs from now on (the one read so far is kept)."""
        self._keep(self.opened)
        self._others.pop(version.number, None)
        self.opened = version

    def _keep(self, version: DatasetVersion) -> None:
        """Keep ``version`` for passes that need it (the fewest recently kept go first)."""
        self._others.pop(version.number, None)
        while len(self._others) >= _KEPT_VERSIONS:
            self._others.pop(next(iter(self._others)))
        self._others[version.number] = version

    def _reopen(self, number: int | tuple[int, ...]) -> DatasetVersion:
        settings = self.opened.settings
        if isinstance(number, tuple):
            return _open_mixture(streams_of(self.source) or [], settings, number)
        return _open_single(self.source, settings, number)
