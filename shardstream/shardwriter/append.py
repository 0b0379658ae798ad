"""Appending to a dataset: new shards after its shards, then a new version published last.

``build_shards(SOURCE, DATASET, append=True)`` runs like a build (the same plan, chunk tasks
and build state in ``DATASET/_shardstream_build``) with these differences:

1. before anything is written, the source is checked against the dataset
   (:mod:`shardstream.shardwriter.appendchecks`) and an empty source publishes nothing;
2. the plan file is created exclusively (a hard link locally, ``If-None-Match: *`` on S3) and
   records the version appended to, so a second append started meanwhile is refused;
3. the parts become ``shard-N.tar`` ... numbered after the dataset's shards (a name that
   exists already is refused, never overwritten);
4. the new version is published with :func:`shardstream.catalog.versions.publish_version`:
   versioned files first, ``manifest.json`` replaced last.

A killed append leaves the old version readable; the same command run again finishes it, and
once it has finished, reports that there is nothing to do (it recognises its own source in
the newest version's settings).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import logging
import os
from collections.abc import Iterable, Mapping
from typing import Any

from shardstream._version import __version__
from shardstream.catalog.versions import publish_version, published_version
from shardstream.errors import ConfigError, DatasetExistsError, ManifestNotFoundError
from shardstream.format.manifest import Manifest, SkippedSample, read_manifest
from shardstream.format.shardtable import ShardTable
from shardstream.format.timminfo import write_timm_info
from shardstream.shardwriter import state
from shardstream.shardwriter.appendchecks import (
    check_appendable,
    check_names_free,
    check_new_source,
    is_empty,
    source_history,
)
from shardstream.shardwriter.chunks import ProgressCallback, write_chunks
from shardstream.shardwriter.options import BuildOptions
from shardstream.shardwriter.plan import plan_chunks
from shardstream.shardwriter.sources import ScannedSource, scan_source
from shardstream.shardwriter.tasks import ChunkResult
from shardstream.storage import Store
from shardstream.storage.lock import destination_lock

__all__ = ["append_source"]

logger = logging.getLogger(__name__)

#: Settings that may differ between the runs of one append (or between appends of the same
#: source) without changing what is appended.
_IGNORED = frozenset({"source_path", "append_to", "source_history"})


def append_source(
    source: str | os.PathLike[str] | Iterable[Mapping[str, Any]],
    dest: Store,
    options: BuildOptions,
    executor: cf.Executor | None,
    progress: ProgressCallback | None,
) -> Manifest:
    """Append ``source``'s samples to the dataset in ``dest``; return the newest manifest.

    Raises:
        ConfigError: An iterable source, or a dataset that is a view or an index of shards
            stored elsewhere.
        ManifestNotFoundError: DEST holds no dataset to append to.
        SourceError: The samples do not match the dataset's (names the first mismatch).
        DatasetExistsError: Another append or build is under way, or won the race.

    Examples:
        >>> append_source("crawl/day2", Store("shards/train"), BuildOptions(append=True),
        ...               None, None).version  # doctest: +SKIP
        2
    """
    if not isinstance(source, (str, os.PathLike)):
        raise ConfigError(
            "append takes an ImageFolder directory or a .csv/.jsonl list; write an iterable's "
            "samples to a list file (or build them into their own dataset and mix the two)"
        )
    base = _read_base(dest)
    if is_empty(os.fspath(source)):
        logger.warning("%s: %s holds no samples; nothing appended", dest.shown(), source)
        return base
    scanned = scan_source(source, options.on_error, progress)  # a bad source leaves DEST untouched
    with destination_lock(dest, "append"):
        return _append(scanned, os.fspath(source), dest, options, executor, progress)


def _read_base(dest: Store) -> Manifest:
    try:
        return read_manifest(dest)
    except ManifestNotFoundError as error:
        raise ManifestNotFoundError(
            f"{dest.shown()}: holds no dataset to append to (no manifest.json). Build it first "
            "with `shardstream build` (without --append), or finish its interrupted build."
        ) from error


def _append(
    scanned: ScannedSource,
    source_path: str,
    dest: Store,
    options: BuildOptions,
    executor: cf.Executor | None,
    progress: ProgressCallback | None,
) -> Manifest:
    base = read_manifest(dest)  # again, under the lock
    settings = {
        **options.output_settings(),
        "source_kind": scanned.kind,
        "source_path": os.path.abspath(source_path),
        "source_fingerprint": scanned.table.fingerprint(),
        "source_items": len(scanned.table) + len(scanned.skipped),
        "append_to": base.version,
    }
    state_store = dest.child(state.STATE_FOLDER)
    if _comparable(base.settings) == _comparable(settings):
        logger.warning("%s: version %d already holds this append", dest.shown(), base.version)
        plan = state.read_plan(state_store)
        if plan is not None and _comparable(plan) == _comparable(settings):
            state.remove_state(state_store)  # this append, killed after publishing, left it
        return base
    history = source_history(dest, base)
    check_new_source(dest, source_path, settings["source_fingerprint"], history)
    settings["source_history"] = history
    check_appendable(dest, base, scanned, options)
    resuming = _claim(dest, state_store, settings)
    chunks = plan_chunks(scanned.table, options)
    first = len(base.shards)
    try:
        check_names_free(dest, base, first, len(chunks), resuming)
    except DatasetExistsError:
        if not resuming:  # refused before writing anything: leave no claim behind either
            state.remove_state(state_store)
        raise
    results = write_chunks(scanned.table, chunks, dest, options, executor, progress, first)
    if published_version(dest) != base.version:
        raise _lost_race(dest, base.version)
    ordered = [results[index] for index in sorted(results)]
    return _publish(dest, base, settings, ordered, scanned.skipped)


def _publish(
    dest: Store,
    base: Manifest,
    settings: dict[str, Any],
    ordered: list[ChunkResult],
    skipped: tuple[SkippedSample, ...],
) -> Manifest:
    """Rename the parts after the dataset's shards, publish the next version, drop the state."""
    state_store = dest.child(state.STATE_FOLDER)
    shards = state.finalize_shards(dest, state_store, ordered, len(base.shards))
    skipped += tuple(item for result in ordered for item in result.skipped)
    manifest = Manifest(
        shards=ShardTable.of([*base.shards, *shards]),
        class_names=base.class_names,
        settings=settings,
        skipped=base.skipped + skipped,
        created_by=f"shardstream {__version__}",
        version=base.version + 1,
        exclusions=base.exclusions,  # the new shards come after: shard numbers stay
        columns=base.columns,  # the new shards have no field files: their fields are None
    )
    write_timm_info(dest, manifest)  # like the shards, it precedes the manifest
    publish_version(dest, manifest)
    state.remove_state(state_store)
    logger.info(
        "%s: version %d: %d samples in %d shards (%d appended)", dest.shown(), manifest.version,
        manifest.num_samples, len(manifest.shards), manifest.num_samples - base.num_samples,
    )  # fmt: skip
    return manifest


def _comparable(settings: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in settings.items() if key not in _IGNORED}


def _claim(dest: Store, state_store: Store, settings: dict[str, Any]) -> bool:
    """Create this append's plan file, or find it from a killed run; True when resuming.

    Raises:
        DatasetExistsError: The state folder holds another build or append.
    """
    plan = state.read_plan(state_store)
    if plan is None:
        state_store.makedirs()
        data = json.dumps(settings, sort_keys=True).encode("utf-8")
        if state_store.create_exclusive(state.PLAN_NAME, data):
            return False
        plan = state.read_plan(state_store) or {}
    mine = {**_comparable(settings), "append_to": settings["append_to"]}
    if {**_comparable(plan), "append_to": plan.get("append_to")} != mine:
        raise DatasetExistsError(
            f"{dest.shown()}: another build or append into this dataset is unfinished or under "
            f"way ({dest.shown(state.STATE_FOLDER)}/{state.PLAN_NAME} records other settings, "
            f"another source or version {plan.get('append_to')!r}). Wait for it, or re-run "
            "its command to finish it, then append again; or, when it was an append that no "
            f"longer runs, `shardstream abandon {dest.shown()}` removes what it wrote."
        )
    state.remove_temporaries(dest)
    return True


def _lost_race(dest: Store, version: int) -> DatasetExistsError:
    return DatasetExistsError(
        f"{dest.shown()}: another append published a new version while this one ran on top of "
        f"version {version}; nothing of this append was published. Run `shardstream abandon "
        f"{dest.shown()}` (it removes this append's files) and then the same command again to "
        "append on top of the new version."
    )
