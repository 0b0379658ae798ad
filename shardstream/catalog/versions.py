"""Dataset versions: immutable versioned manifests, and ``manifest.json`` pointing at the newest.

A dataset that grows (``build_shards(..., append=True)``) publishes a new version each time::

    DATASET/manifest.v000001.json     version 1 (a copy of the first build's manifest.json)
    DATASET/manifest.v000002.json     version 2: every shard of version 1, then the new ones
    DATASET/manifest.v000002.shards   its binary shard table, when it has one (format 2)
    DATASET/manifest.json             the published version: the same bytes as the newest

A versioned file is created once and never rewritten: it is written with an exclusive create
(a hard link locally, ``If-None-Match: *`` on S3), so of two appends of the same version one
wins and the other is refused. ``manifest.json`` is replaced last, in one atomic step (a rename
locally, a single ``PutObject`` on S3): readers see the old version or the new one, never a mix,
and readers that know nothing of versions keep reading ``manifest.json``. A manifest without a
``version`` field is version 1; a dataset that never grew has no versioned files at all.

Appends only add shards, so every version's shards are a prefix of the newest one's, until
``shardstream compact`` rewrites the shards that hold excluded samples: pruning an old version
removes its manifest files, and the shard files that no kept version lists
(:mod:`shardstream.catalog.unlisted`).
"""

from __future__ import annotations

import json

from shardstream.catalog.unlisted import files_only_in
from shardstream.errors import DatasetExistsError, ManifestError, ManifestNotFoundError
from shardstream.format.manifest import (
    MANIFEST_NAME,
    Manifest,
    encode_manifest,
    read_manifest_file,
)
from shardstream.storage import Store

__all__ = [
    "DEFAULT_KEEP",
    "list_versions",
    "prune_plan",
    "prune_versions",
    "publish_version",
    "published_version",
    "read_version",
    "version_name",
]


def version_name(version: int, suffix: str = "json") -> str:
    """``manifest.v000002.json`` (``suffix="shards"``: its shard table)."""
    return f"manifest.v{version:06d}.{suffix}"


def list_versions(store: Store) -> list[int]:
    """Every version of the dataset that can still be read, oldest first.

    Examples:
        >>> list_versions(Store("shards/train"))  # doctest: +SKIP
        [1, 2, 3]
    """
    if not store.exists(MANIFEST_NAME):
        return []
    # Probe down from the published version instead of listing the folder: a dataset of a
    # million shards lists in a minute, and `prune` only ever removes the oldest versions.
    newest = published_version(store)
    versions = [newest]
    while versions[-1] > 1 and store.exists(version_name(versions[-1] - 1)):
        versions.append(versions[-1] - 1)
    return versions[::-1]


def published_version(store: Store) -> int:
    """The version ``manifest.json`` describes (1 when it has no ``version`` field)."""
    try:
        version = json.loads(store.read_bytes(MANIFEST_NAME)).get("version", 1)
    except (ValueError, AttributeError) as error:
        raise ManifestError(f"{store.shown(MANIFEST_NAME)}: not valid JSON ({error})") from error
    return int(version)


def read_version(store: Store, version: int) -> Manifest:
    """The manifest of ``version`` (published by a build or an append, and not pruned).

    Raises:
        ManifestNotFoundError: No such version (never published, or pruned); names the ones
            that exist.
    """
    name = version_name(version)
    if store.exists(name):
        return read_manifest_file(store, name)
    if store.exists(MANIFEST_NAME) and published_version(store) == version:
        return read_manifest_file(store, MANIFEST_NAME)
    raise ManifestNotFoundError(
        f"{store.shown()}: has no version {version} (versions that can be read: "
        f"{list_versions(store) or 'none'}); it was never published or `shardstream prune` "
        "removed it. Read another version, or the newest with version=None."
    )


def publish_version(store: Store, manifest: Manifest) -> str:
    """Publish ``manifest`` as version ``manifest.version``; ``manifest.json`` last.

    Idempotent for the same manifest (a rerun after a kill finds its own files and goes on).
    Before the first append, the dataset's version 1 is kept as ``manifest.v000001.json``.

    Raises:
        DatasetExistsError: Another writer published this version with other contents.
    """
    version = manifest.version
    if version > 1:
        _keep_previous(store, version - 1)
    text, table = encode_manifest(manifest, version_name(version, "shards"), store.shown())
    if table is not None:
        _create_once(store, version_name(version, "shards"), table, version)
    for name, data in manifest.sidecars().items():
        _create_once(store, name, data, version)
    _create_once(store, version_name(version), text, version)
    with store.open_atomic_write(MANIFEST_NAME) as stream:
        stream.write(text)
    return store.url(MANIFEST_NAME)


def _keep_previous(store: Store, previous: int) -> None:
    """Keep the published version under its own name before ``manifest.json`` moves on."""
    name = version_name(previous)
    if store.exists(name) or not store.exists(MANIFEST_NAME):
        return
    data = store.read_bytes(MANIFEST_NAME)
    if int(json.loads(data).get("version", 1)) == previous:
        store.create_exclusive(name, data)


def _create_once(store: Store, name: str, data: bytes, version: int) -> None:
    if store.create_exclusive(name, data) or store.read_bytes(name) == data:
        return
    raise DatasetExistsError(
        f"{store.shown()}: version {version} was published by another append meanwhile "
        f"({name} exists with other contents), so this append is refused. Run the same command "
        "again to append on top of the new version (if nothing was published, an append, "
        "exclude or compact was killed before it finished: `shardstream abandon` removes its "
        "files)."
    )


#: Versions ``prune`` keeps unless told otherwise: the published one and the one before it,
#: which a job that started before the last append reads (and resumes) until its epoch ends.
DEFAULT_KEEP = 2


def prune_plan(store: Store, keep: int = DEFAULT_KEEP) -> dict[int, dict[str, int]]:
    """What :func:`prune_versions` would remove: per version, its files and their sizes.

    A version's files are its manifest and sidecars, and the shard files (with their indexes)
    that only removed versions list: old files that ``shardstream compact`` replaced.

    Raises:
        ValueError: ``keep`` is below 1.

    Examples:
        >>> prune_plan(Store("shards/train"), keep=2)  # doctest: +SKIP
        {1: {'manifest.v000001.json': 1375}}
    """
    if keep < 1:
        raise ValueError(f"keep must be at least 1 (the published version), got {keep}")
    versions = list_versions(store)
    newest = published_version(store)
    published = _sidecars_of(store, MANIFEST_NAME)
    kept = [read_version(store, version) for version in versions[max(0, len(versions) - keep) :]]
    plan: dict[int, dict[str, int]] = {}
    seen: set[str] = set()
    for version in versions[: max(0, len(versions) - keep)]:
        name = version_name(version)
        if version == newest or not store.exists(name):
            continue
        shards = [item for item in files_only_in(read_version(store, version), kept)
                  if item not in seen]  # fmt: skip
        seen.update(shards)
        own = [item for item in _sidecars_of(store, name) if item not in published]
        # Shard files first and the manifest last: a killed prune leaves a manifest that
        # still names what is left to remove, and the next run removes it.
        names = [*shards, *own, name]
        plan[version] = {item: _size(store, item) for item in names if store.exists(item)}
    return plan


def prune_versions(store: Store, keep: int = DEFAULT_KEEP) -> list[int]:
    """Remove all but the newest ``keep`` versions; return the versions removed.

    A removed version's manifest files go, and the shard files only removed versions list
    (the ones ``shardstream compact`` replaced); every other shard is also a kept version's
    and stays. A job whose epoch reads a removed version cannot resume that epoch, so keep
    every version a running job (or a checkpoint you may resume) reads; views made of a
    removed version read shard files that may be gone.

    Examples:
        >>> prune_versions(Store("shards/train"), keep=2)  # doctest: +SKIP
        [1, 2]
    """
    plan = prune_plan(store, keep)
    for files in plan.values():
        for name in files:  # in the plan's order: the manifest last
            if name.endswith("/"):
                store.remove_folder(name.rstrip("/"))
            else:
                store.remove(name)
    return list(plan)


def _size(store: Store, name: str) -> int:
    """A file's size, or a folder's (``name/``): every file under it."""
    if not name.endswith("/"):
        return store.size(name)
    folder = name.rstrip("/")
    inside = sum(store.size(f"{folder}/{item}") for item in store.list_names(folder))
    return inside + sum(_size(store, f"{folder}/{item.rstrip('/').rpartition('/')[2]}/")
                        for item in store.list_folders(folder))  # fmt: skip


def _sidecars_of(store: Store, name: str) -> list[str]:
    """The shard table and sidecars the manifest file ``name`` names."""
    document = json.loads(store.read_bytes(name))
    entries = [document.get("shard_table"), document.get("excluded")]
    return [entry["name"] for entry in entries if isinstance(entry, dict) and "name" in entry]
