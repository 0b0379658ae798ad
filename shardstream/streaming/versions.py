"""Which version of a growing dataset a pass reads.

A :class:`~shardstream.streaming.StreamingDataset` opens one version (the newest published
when it is made, or the one pinned with ``version=N``) and reads it in every fresh epoch. A
pass records the version it reads in its state (``dataset_version``), so a job restarted
after the dataset grew finishes the interrupted epoch on the version it began with, exactly,
and the next epoch reads the version the restarted job opened. States saved before versions
existed have no ``dataset_version``: they were saved on version 1 (the only version a dataset
could have then).

Older versions are opened on demand, once per process; a version removed by
``shardstream prune`` cannot be resumed (the error says which and what to do).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from shardstream.errors import ConfigError, ManifestNotFoundError
from shardstream.format.manifest import Manifest
from shardstream.streaming.shardlist import ShardList, resolve_source

__all__ = ["DatasetVersion", "VersionSet"]

#: What a state without ``dataset_version`` was saved on (see the module docstring).
LEGACY_VERSION = 1


@dataclasses.dataclass(frozen=True)
class DatasetVersion:
    """One version's shards and manifest, and the pass cache built on them."""

    number: int | None
    shards: ShardList
    manifest: Manifest | None
    passes: Any  # a PassCache (kept untyped here: epochs imports this module's users)


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
        open_version: Callable[[int], DatasetVersion],
    ) -> None:
        self.source, self.opened = source, opened
        self._open_version = open_version
        self._older: dict[int, DatasetVersion] = {}

    def number_for(self, saved: Mapping[str, Any]) -> int | None:
        """The version a saved state's pass reads (``dataset_version``, or the legacy rule)."""
        if "dataset_version" in saved:
            value = saved["dataset_version"]
            return None if value is None else int(value)
        return LEGACY_VERSION if self.opened.number is not None else None

    def get(self, number: int | None) -> DatasetVersion:
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


def open_version(
    source: Any, options: Any, number: int | None, make_passes: Callable[[ShardList], Any]
) -> DatasetVersion:
    """Open ``source`` at version ``number`` (None: the newest) with its pass cache."""
    _, shards, manifest = resolve_source(
        source, options.storage_options, options.read_options, version=number
    )
    return DatasetVersion(
        manifest.version if manifest else None, shards, manifest, make_passes(shards)
    )
