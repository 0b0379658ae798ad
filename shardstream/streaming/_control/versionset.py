"""What a pass's plan costs to compute, kept per process: the epoch's shard order and the
sequences of its passes (restores ask for the same pass repeatedly).

Which version of a growing dataset a pass reads.

A :class:`~shardstream.streaming.StreamingDataset` opens one version (the newest published
when it is made, or the one pinned with ``version=N``) and reads it in every fresh epoch; under
torch.distributed every rank reads the one the job's first rank to make it opened, and the job
may move on to newer versions between epochs (see
:mod:`shardstream.streaming._control.versionset`). A pass records the version it reads in its
state (``dataset_version``), so a job restarted after the dataset grew finishes the
interrupted epoch on the version it began with, exactly, and the next epoch reads the version
the restarted job opened. States saved before versions existed have no ``dataset_version``:
they were saved on version 1 (the only version a dataset could have then). A mixture's version
is the tuple of its streams' versions: a resumed epoch reads every stream at the version it
began with.

Other versions are opened on demand, once per process (a few are kept); a version removed by
``shardstream prune`` cannot be resumed (the error says which and what to do).

How the ranks of a job agree on the version of a growing dataset they read.

Ranks make their datasets moments apart (a multi-node restart: seconds), and an append
published in between would have them open different versions: different shard lists, unequal
epochs, a collective that hangs. So the training processes settle on one without waiting for
each other (:func:`settle`): the first rank of the job to make a dataset of a source posts the
version it opened to the process group's store (one compare-and-set,
:func:`~.context.post_first`), and every rank that makes the matching dataset reads that
version. Datasets match by their source and by how many datasets of that source the rank made
before, so a dataset that only some ranks make (rank 0's evaluation, say) never blocks: it is
not a collective. A rank that cannot read the posted version (pruned meanwhile) stops with an
error naming both versions. :func:`refresh` moves fresh epochs to the newest version the same
way: the first rank to refresh reads ``manifest.json`` and posts what it found, and every rank
opens that.

The post is passed in (:func:`~.context.post_first`), so all of this runs without processes in
tests."""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, cast

from shardstream._catalog.shardlist import ShardList, Source, newest_version, resolve_source
from shardstream._format.manifest import Manifest
from shardstream._storage.background import ProcessLock
from shardstream.errors import ConfigError, ManifestNotFoundError
from shardstream.streaming._control.resumestate import SavedState, VersionNumber
from shardstream.streaming._options import Mixture, Settings, Stream
from shardstream.streaming._planning.leftover import PassRecord, pass_sequence
from shardstream.streaming._planning.order import PlanOptions, epoch_sequence
from shardstream.streaming._planning.sequence import BaseSequence, PassSequence
from shardstream.streaming._planning.split import Layout, PassPlan, Shape

__all__ = [
    "DatasetVersion",
    "PlanCache",
    "Post",
    "VersionNumber",
    "VersionSet",
    "open_version",
    "refresh",
    "settle",
    "streams_of",
]


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


logger = logging.getLogger("shardstream.streaming")

#: ``(key, value)`` -> the value first posted under ``key`` (``context.post_first``; None alone).
Post = Callable[[str, str], "str | None"]

#: Datasets of each source this process has settled, so that its n-th dataset of a source
#: matches the n-th of every other rank (see the module docstring).
_made: collections.Counter[str] = collections.Counter()


def settle(versions: VersionSet, post: Post, rank: int) -> str | None:
    """Make this rank read the version the job's first rank to make this dataset opened.

    Never waits for another rank (see the module docstring). Datasets without versions (no
    manifest) have nothing to agree on. Returns the dataset's key in the store (which
    :func:`refresh` builds on), None when nothing was agreed.

    Raises:
        ConfigError: That version cannot be read here (pruned meanwhile), or this rank pinned
            another one with ``version=N``; the message names both.
    """
    opened = versions.opened.number
    if opened is None:
        return None
    source = _identity(versions)
    _made[source] += 1
    key = f"shardstream/version/{source}/{_made[source]}"
    posted = post(key, json.dumps(opened))
    if posted is None:
        return None
    target = _decoded(posted)
    if target == opened:
        return key
    if versions.pinned:
        raise ConfigError(
            f"{_shown(versions)}: rank {rank} was made with version={opened}, but the job's "
            f"first rank to make this dataset reads version {target}; pass the same "
            "version=N on every rank"
        )
    try:
        moved = versions.other(target)
    except (ValueError, OSError) as error:
        raise ConfigError(
            f"{_shown(versions)}: rank {rank} opened version {opened}, but the job's first "
            f"rank to make this dataset opened version {target}, which rank {rank} cannot "
            f"read ({error}). Every rank must read one version: start the ranks again (they "
            "then agree on the newest version), or pass the same version=N on every rank."
        ) from error
    logger.info(
        "%s: rank %d opened version %s; it reads version %s, the one the job's first rank to "
        "make this dataset opened", _shown(versions), rank, opened, target,
    )  # fmt: skip
    versions.move_to(moved)
    return key


def refresh(versions: VersionSet, post: Post, key: str | None, rank: int) -> VersionNumber:
    """Move fresh epochs to the newest version; return the version now read.

    The first rank to refresh looks up the newest version and posts it under ``key`` (the
    dataset's key from :func:`settle` and the refresh's number; None: nothing to agree on);
    every rank reads what it posted. No rank waits for another.

    Raises:
        ConfigError: The newest version cannot be read here, or the version was pinned with
            ``version=N``.
    """
    opened = versions.opened
    if versions.pinned:
        raise ConfigError(
            f"{_shown(versions)}: the dataset was made with version={opened.number}, which "
            "stays; make it without version= to move to newer versions"
        )
    try:
        proposal = _newest(versions.source, opened.settings, opened.number)
    except (OSError, ValueError) as error:
        raise ConfigError(
            f"{_shown(versions)}: rank {rank} could not read the newest version ({error})"
        ) from error
    posted = None if key is None or proposal is None else post(key, json.dumps(proposal))
    target = proposal if posted is None else _decoded(posted)
    if target is None or target == opened.number:
        return opened.number
    try:
        moved = versions.other(target)
    except (ValueError, OSError) as error:
        raise ConfigError(
            f"{_shown(versions)}: the job moves to version {target} (the newest when its first "
            f"rank looked), which rank {rank} cannot read ({error}). Start the ranks again, "
            "or pass the same version=N on every rank."
        ) from error
    versions.move_to(moved)
    return target


def _decoded(posted: str) -> int | tuple[int, ...]:
    """A version number as :func:`settle` and :func:`refresh` post it (JSON)."""
    found = json.loads(posted)
    return tuple(found) if isinstance(found, list) else int(found)


def _newest(source: Any, settings: Settings, current: VersionNumber) -> VersionNumber:
    """The version a fresh open of ``source`` would read now (reads ``manifest.json`` only)."""
    storage_options = settings.options.storage_options
    streams = streams_of(source)
    if streams is None:
        newest = newest_version(cast(Source, source), storage_options)
        return current if newest is None else newest
    numbers = current if isinstance(current, tuple) else (0,) * len(streams)
    found = []
    for stream, number in zip(streams, numbers, strict=True):
        if stream.version is None:
            options = stream.storage_options
            newest = newest_version(stream.source, storage_options if options is None else options)
            number = number if newest is None else newest
        found.append(number)
    return tuple(found)


def _identity(versions: VersionSet) -> str:
    """A short name of the dataset's source, the same on every rank."""
    source = versions.source
    streams = streams_of(source)
    if streams is not None:
        shown = repr([(str(stream.source), stream.version) for stream in streams])
    else:
        shown = os.fspath(source) if isinstance(source, (str, os.PathLike)) else repr(source)
    return hashlib.sha256(str(shown).encode()).hexdigest()[:16]


def _shown(versions: VersionSet) -> str:
    source = versions.source
    return str(source) if isinstance(source, (str, os.PathLike)) else "the mixture"
