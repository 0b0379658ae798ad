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
error naming both versions. :func:`refresh` moves fresh epochs to the newest version the same
way: the first rank to refresh reads ``manifest.json`` and posts what it found, and every rank
opens that.

The post is passed in (:func:`~.context.post_first`), so all of this runs without processes in
tests.
"""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
from collections.abc import Callable
from typing import Any, cast

from shardstream.catalog.shardlist import Source, newest_version
from shardstream.errors import ConfigError
from shardstream.streaming.control.resumestate import VersionNumber
from shardstream.streaming.control.versionset import VersionSet, streams_of
from shardstream.streaming.settings import Settings

__all__ = ["Post", "refresh", "settle"]

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
