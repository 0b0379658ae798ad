"""Abandoning an unfinished append (or exclude, or compact): remove what it wrote, so the next
one starts clean.

An append killed part-way (see :mod:`shardstream.shardwriter.append`) is finished by running
the same command again. When that is not wanted (its source is gone, or was the wrong one),
:func:`abandon_append` removes what it left: its build state (``DATASET/_shardstream_build``),
the shards and indexes it had already renamed into the dataset (``shard-N.tar`` numbered after
the published version's shards, listed by no version), a versioned manifest (and its sidecars)
newer than the published one, the rewritten shards of a killed ``compact``
(``compacted/vN/``, listed by no version), and temporaries; timm's ``_info.json`` is written
again when it named the abandoned shards. The published version, and every shard it lists,
stay as they are.
"""

from __future__ import annotations

import json
import os
import re

from shardstream.catalog.versions import list_versions, read_version
from shardstream.errors import ConfigError, ManifestNotFoundError
from shardstream.format.manifest import Manifest, read_manifest
from shardstream.format.shardindex import index_name
from shardstream.format.timminfo import TIMM_INFO_NAME, timm_info_json
from shardstream.shardwriter import state
from shardstream.shardwriter.compact import COMPACTED_FOLDER
from shardstream.storage import StorageOptions, Store
from shardstream.storage.lock import destination_lock

__all__ = ["abandon_append"]

_SHARD = re.compile(r"shard-(\d{6,})\.(tar|idx)")
_VERSION_FOLDER = re.compile(r"(?:compacted|columns)/v(\d{6,})")
_VERSIONED = re.compile(r"manifest\.v(\d{6,})\.(json|shards|excluded)")


def abandon_append(
    dest: str | os.PathLike[str],
    storage_options: StorageOptions = None,
    *,
    dry_run: bool = False,
) -> list[str]:
    """Remove what an unfinished append left in the dataset ``dest``; return the names removed.

    Run it only when no append into ``dest`` is running: on local disk the dataset's lock
    refuses while one is; on object stores there is no lock, so make sure yourself.

    Args:
        dest: The dataset folder or URL.
        storage_options: fsspec options for a URL.
        dry_run: Only list what would be removed.

    Raises:
        ManifestNotFoundError: ``dest`` holds no published dataset.
        ConfigError: ``dest`` holds an unfinished build (not an append).
        DatasetExistsError: An append or build into ``dest`` is running (local disk).

    Examples:
        >>> abandon_append("shards/crawl")  # doctest: +SKIP
        ['_shardstream_build/', 'shard-000042.tar', 'shard-000042.tar.idx']
    """
    store = Store(os.fspath(dest), storage_options)
    with destination_lock(store, "abandon"):
        base = _published(store)
        state_store = store.child(state.STATE_FOLDER)
        plan = state.read_plan(state_store)
        if plan is not None and "append_to" not in plan:
            raise ConfigError(
                f"{store.shown(state.STATE_FOLDER)}: holds an unfinished build, not an append; "
                "run that build's command again to finish it (or build with --overwrite)"
            )
        names = _leftovers(store, base)
        folders = _compacted_leftovers(store, base)
        shown = ([f"{state.STATE_FOLDER}/"] if state_store.exists() else []) + names
        shown += [f"{folder}/" for folder in folders]
        if dry_run:
            return shown
        for name in names:
            store.remove(name)
        for folder in folders:
            store.remove_folder(folder)
        state.remove_state(state_store)
        _restore_timm_info(store, base, set(names), tuple(f"{folder}/" for folder in folders))
    return shown


def _published(store: Store) -> Manifest:
    try:
        return read_manifest(store)
    except ManifestNotFoundError as error:
        raise ManifestNotFoundError(
            f"{store.shown()}: holds no published dataset (no manifest.json), so there is no "
            "append to abandon; an unfinished first build is finished by running it again"
        ) from error


def _leftovers(store: Store, base: Manifest) -> list[str]:
    """Files of the dataset's folder that no version has published and an append writes."""
    listed = {shard.name for shard in base.shards}
    listed |= {index_name(shard.name) for shard in base.shards}
    return sorted(name for name in store.list_names() if _left_by_append(name, base, listed))


def _compacted_leftovers(store: Store, base: Manifest) -> list[str]:
    """``compacted/vN`` and ``columns/vN`` folders a killed ``compact`` or ``attach`` wrote: of
    an unpublished version, or that no readable version reads."""
    folders = []
    for parent in (COMPACTED_FOLDER, "columns"):
        for folder in store.list_folders(parent):
            name = f"{parent}/{folder.rstrip('/').rpartition('/')[2]}"
            match = _VERSION_FOLDER.fullmatch(name)
            if match is None:
                continue
            if int(match.group(1)) > base.version or not _read_by_a_version(store, name):
                folders.append(name)
    return folders


def _read_by_a_version(store: Store, folder: str) -> bool:
    for version in list_versions(store):
        manifest = read_version(store, version)
        if manifest.columns is not None and manifest.columns.folder == folder:
            return True
        if any(name.startswith(folder + "/") for name in manifest.shards.names):
            return True
    return False


def _left_by_append(name: str, base: Manifest, listed: set[str]) -> bool:
    shard, versioned = _SHARD.fullmatch(name), _VERSIONED.fullmatch(name)
    if shard is not None:
        return int(shard.group(1)) >= len(base.shards) and name not in listed
    if versioned is not None:
        return int(versioned.group(1)) > base.version
    return ".tmp-" in name


def _restore_timm_info(
    store: Store, base: Manifest, removed: set[str], folders: tuple[str, ...]
) -> None:
    """Write ``_info.json`` for the published version again if it named removed shards."""
    if not store.exists(TIMM_INFO_NAME):
        return
    try:
        splits = json.loads(store.read_bytes(TIMM_INFO_NAME)).get("splits") or {}
    except (ValueError, AttributeError):
        return  # not timm's file as shardstream writes it: leave it alone
    for split, entry in splits.items():
        named = set(entry.get("filenames") or [])
        if removed & named or any(name.startswith(folders) for name in named):
            with store.open_atomic_write(TIMM_INFO_NAME) as stream:
                stream.write(timm_info_json(base, split).encode("utf-8"))
            return
