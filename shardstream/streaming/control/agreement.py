"""How the ranks of a job agree on the version of a growing dataset they read.

Ranks make their datasets moments apart (a multi-node restart: seconds), and an append
published in between would have them open different versions: different shard lists, unequal
epochs, a collective that hangs. So the training processes settle on one without waiting for
each other (:func:`settle`): the first rank of the job to make a dataset of a source posts the
version it opened to the process group's store (one compare-and-set,
:func:`~.context.post_first`), and every rank that makes the matching dataset reads that
version. Datasets match by their source and by how many datasets of that source the rank made
before, so a dataset that only some ranks make (rank 0's evaluation, say) never blocks: it is
not a collective. A rank that cannot read the posted version (pruned meanwhile) stops with an
error naming both versions. :func:`refresh` moves fresh epochs to the newest version (a
collective, at ``set_epoch`` on every rank): rank 0 reads ``manifest.json``, every rank opens
what it found.

The post and the gather are passed in (:func:`~.context.post_first`,
:func:`~.context.gather_from_ranks`), so all of this runs without processes in tests.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, cast

from shardstream.catalog.shardlist import Source, newest_version
from shardstream.errors import ConfigError
from shardstream.streaming.control.resumestate import VersionNumber
from shardstream.streaming.control.versionset import DatasetVersion, VersionSet, streams_of
from shardstream.streaming.settings import Settings

__all__ = ["Gather", "Post", "refresh", "settle"]

logger = logging.getLogger("shardstream.streaming")

#: Every rank's value, in rank order (``context.gather_from_ranks``; ``[value]`` alone).
Gather = Callable[[Any], list[Any]]
#: ``(key, value)`` -> the value first posted under ``key`` (``context.post_first``; None alone).
Post = Callable[[str, str], "str | None"]

#: Datasets of each source this process has settled, so that its n-th dataset of a source
#: matches the n-th of every other rank (see the module docstring).
_made: collections.Counter[str] = collections.Counter()


def settle(versions: VersionSet, post: Post, rank: int) -> None:
    """Make this rank read the version the job's first rank to make this dataset opened.

    Never waits for another rank (see the module docstring). Datasets without versions (no
    manifest) have nothing to agree on.

    Raises:
        ConfigError: That version cannot be read here (pruned meanwhile), or this rank pinned
            another one with ``version=N``; the message names both.
    """
    opened = versions.opened.number
    if opened is None:
        return
    source = _identity(versions)
    _made[source] += 1
    key = f"shardstream/version/{source}/{_made[source]}"
    posted = post(key, json.dumps(opened))
    if posted is None:
        return
    found = json.loads(posted)
    target: int | tuple[int, ...] = tuple(found) if isinstance(found, list) else int(found)
    if target == opened:
        return
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


def refresh(versions: VersionSet, gather: Gather, rank: int) -> VersionNumber:
    """Move fresh epochs to the newest version (rank 0 looks); return the version now read.

    Raises:
        ConfigError: As :func:`settle`, or rank 0 could not read the newest version, or the
            version was pinned with ``version=N``.
    """
    opened = versions.opened
    if versions.pinned:
        raise ConfigError(
            f"{_shown(versions)}: the dataset was made with version={opened.number}, which "
            "stays; make it without version= to move to newer versions"
        )
    proposal: Any = None
    if rank == 0:
        try:
            proposal = _newest(versions.source, opened.settings, opened.number)
        except (OSError, ValueError) as error:  # every rank learns it through the gather
            proposal = f"rank 0 could not read the newest version ({error})"
    _move(versions, gather, rank, proposal)
    return versions.opened.number


def _move(versions: VersionSet, gather: Gather, rank: int, proposal: Any) -> None:
    """Every rank reads rank 0's ``proposal``; all stop together if one cannot."""
    reports = gather((proposal, versions.opened.number))
    target, opened = reports[0][0], [report[1] for report in reports]
    if isinstance(target, str):
        raise ConfigError(f"{_shown(versions)}: {target}; every rank stopped")
    if target is None or all(number == target for number in opened):
        return
    moved: DatasetVersion | None = None
    failure = None
    if versions.opened.number != target:
        try:
            if versions.pinned:
                raise ConfigError(f"it was made with version={versions.opened.number}")
            moved = versions.other(target)
        except (ValueError, OSError) as error:
            failure = f"rank {rank}: {error}"
    failures = [failure for failure in gather(failure) if failure]
    if failures:
        raise ConfigError(
            f"{_shown(versions)}: the ranks opened different versions ({_by_rank(opened)}), "
            f"and not every rank can read version {target}, rank 0's ({failures[0]}). Start "
            "the ranks again (they then agree on the newest version), or pin version=N."
        )
    if moved is not None:
        logger.info(
            "%s: ranks opened versions %s; this rank reads version %s, rank 0's",
            _shown(versions), _by_rank(opened), target,
        )  # fmt: skip
        versions.move_to(moved)


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


def _by_rank(numbers: Sequence[VersionNumber]) -> str:
    """``rank 0: version 2, rank 1: version 3`` (rank 0 and the first ranks that differ)."""
    differ = [(rank, number) for rank, number in enumerate(numbers) if number != numbers[0]]
    shown = [(0, numbers[0]), *differ[:3]]
    return ", ".join(f"rank {rank}: version {number}" for rank, number in shown)
