"""Shard files that only pruned versions list: what ``prune`` deletes besides manifests.

Appends only add shards, so before ``shardstream compact`` every version's shards are also the
newest version's. A compacted version lists rewritten files in place of the old ones (at the
same shard numbers), so once every version that lists an old file is pruned, the file (and its
index) can go: that is when an excluded sample's bytes are really gone.

Dataset versions: immutable versioned manifests, and ``manifest.json`` pointing at the newest.

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
(:mod:`shardstream._catalog.versions`).

Which views read a dataset's files: records that ``prune`` reads, and the check a view's
reader makes when the version it was made of is gone.

A view reads its source's shard, index and field files where they are. Making one leaves a
record in the source (``_shardstream_views/<hash>.json``: the view's location and the version it
was made of), when the source can be written; ``prune`` names the recorded views whose files it
would remove. Opening a view whose source version was pruned checks that its files are still
there, and refuses at once, naming the view and a missing file, rather than failing on a
missing file inside a DataLoader worker."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence

from shardstream._format.columns import column_file
from shardstream._format.manifest import (
    MANIFEST_NAME,
    Manifest,
    absolute_root,
    encode_manifest,
    read_manifest,
    read_manifest_file,
    root_store,
)
from shardstream._format.shardtable import NameColumn
from shardstream._storage import Store
from shardstream.errors import (
    DatasetExistsError,
    ManifestError,
    ManifestNotFoundError,
    ShardstreamError,
)

__all__ = [
    "DEFAULT_KEEP",
    "VIEWS_FOLDER",
    "check_view_files",
    "files_only_in",
    "list_versions",
    "prune_plan",
    "prune_versions",
    "publish_version",
    "published_version",
    "read_version",
    "record_view",
    "version_name",
    "views_reading",
]


def files_only_in(removed: Manifest, kept: Sequence[Manifest]) -> list[str]:
    """The shard and index files ``removed`` lists that no manifest of ``kept`` lists.

    Shard numbers are stable across versions (appends add after, exclude and compact keep
    them), so a file is compared with the files the other versions list at its number. Shards
    stored elsewhere (``shard_root``, ``index_root``) are never listed: they are not the
    dataset's to delete.

    Examples:
        >>> files_only_in(read_version(store, 1), [read_version(store, 3)])  # doctest: +SKIP
        ['shard-000002.tar', 'shard-000002.idx']
    """
    if removed.shard_root is not None or removed.index_root is not None:
        return []
    files: list[str] = []
    dropped: list[str] = []
    columns = [("names", removed.shards.names), ("indexes", removed.shards.indexes)]
    for attribute, old in columns:
        if old is None:
            continue
        others = [getattr(manifest.shards, attribute) for manifest in kept]
        found = [old[number] for number in _changed(old, others) if old[number]]
        dropped += found if attribute == "names" else []
        files += found
    return files + _field_files(removed, kept, dropped)


def _field_files(removed: Manifest, kept: Sequence[Manifest], dropped: list[str]) -> list[str]:
    """The attached-field files only ``removed`` reads: its folder (``columns/vN/``, ending in
    a slash) when no kept version reads it, else the files of its dropped shards."""
    columns = removed.columns
    if columns is None or columns.root is not None:
        return []
    if all(manifest.columns is None or manifest.columns.folder != columns.folder
           for manifest in kept):  # fmt: skip
        return [f"{columns.folder}/"]
    return [column_file(columns.folder, name) for name in dropped]


def _changed(old: NameColumn, others: Sequence[NameColumn | None]) -> list[int]:
    """The numbers at which no column of ``others`` holds ``old``'s name."""
    present = [column for column in others if column is not None]
    if old.template is not None and any(column.template == old.template for column in present):
        return []  # the same names counting up: nothing was rewritten (the usual case)
    changed = []
    for number, name in enumerate(old):
        if all(number >= len(column) or column[number] != name for column in present):
            changed.append(number)
    return changed


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
    if not store.exists(MANIFEST_NAME):  # raises what read_manifest says: no folder, no manifest
        read_manifest_file(store, MANIFEST_NAME)
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


logger = logging.getLogger(__name__)

VIEWS_FOLDER = "_shardstream_views"


def record_view(origin: Store, dest: Store, source_version: int) -> None:
    """Note in ``origin`` that the view in ``dest`` reads its version ``source_version``
    (skipped, with a log line, where ``origin`` cannot be written: a read-only bucket...)."""
    where = absolute_root(dest)
    name = f"{hashlib.sha256(where.encode()).hexdigest()[:20]}.json"
    record = json.dumps({"view": where, "source_version": source_version}, sort_keys=True)
    try:
        with origin.child(VIEWS_FOLDER).open_atomic_write(name) as stream:
            stream.write(record.encode("utf-8"))
    except (OSError, ShardstreamError) as error:
        logger.info("%s: the view is not recorded there (%s); `prune` cannot name it",
                    origin.shown(), error)  # fmt: skip


def views_reading(store: Store, removed: Iterable[str]) -> list[tuple[str, int, str]]:
    """The recorded views of ``store`` that read a file of ``removed`` (names in ``store``;
    a folder ends in ``/``): ``(view, the version it was made of, a file it would lose)``."""
    removed = list(removed)
    try:
        records = sorted(store.list_names(VIEWS_FOLDER)) if removed else []
    except (OSError, ShardstreamError):
        records = []  # no view recorded
    mine = absolute_root(store)
    found = []
    for name in records:
        try:
            record = json.loads(store.child(VIEWS_FOLDER).read_bytes(name))
            view = read_manifest(Store(record["view"], store.storage_options))
        except (OSError, ValueError, KeyError, TypeError, ShardstreamError):
            continue  # removed since, or not readable here: nothing to name
        if view.view is None or view.view.get("source_root", mine) != mine:
            continue
        lost = _first_lost(_files_of(view), removed)
        if lost is not None:
            found.append((str(record["view"]), int(view.view.get("source_version", 0)), lost))
    return found


def _files_of(view: Manifest) -> Iterable[str]:
    table = view.shards
    yield from table.names
    if table.indexes is not None:
        yield from (name for name in table.indexes if name)
    if view.columns is not None:
        for number in range(min(view.columns.num_shards, len(table))):
            yield column_file(view.columns.folder, table.names[number])


def _first_lost(files: Iterable[str], removed: Sequence[str]) -> str | None:
    exact = {name for name in removed if not name.endswith("/")}
    folders = tuple(name for name in removed if name.endswith("/"))
    for name in files:
        if name in exact or (folders and name.startswith(folders)):
            return name
    return None


def check_view_files(dataset: Store, manifest: Manifest) -> None:
    """Refuse a view whose source version was pruned and whose files went with it.

    Costs one or two existence checks while the source version is readable (every file of a
    readable version stays); only a view of a pruned version checks its files one by one.

    Raises:
        ManifestError: A file the view reads is gone; names the view, the file and the fix.
    """
    view = manifest.view
    if view is None or "source_version" not in view:
        return
    root = view.get("source_root") or manifest.shard_root
    if root is None:
        return
    source, version = root_store(dataset, root), int(view["source_version"])
    try:
        if not source.exists(MANIFEST_NAME):
            return  # not the source dataset's folder (an old view of indexed shards), or gone
        if source.exists(version_name(version)) or published_version(source) == version:
            return
    except (OSError, ShardstreamError):
        return  # the source cannot be asked: the reads will say what is wrong
    places: list[tuple[Store, Iterable[str]]] = [
        (root_store(dataset, manifest.shard_root), manifest.shards.names),
        (root_store(dataset, manifest.index_root),
         [name for name in manifest.shards.indexes or () if name]),
    ]  # fmt: skip
    if manifest.columns is not None:
        names = manifest.shards.names[: manifest.columns.num_shards]
        fields = [column_file(manifest.columns.folder, name) for name in names]
        places.append((root_store(dataset, manifest.columns.root), fields))
    for store, files in places:
        missing = [name for name in files if not store.exists(name)]
        if missing:
            raise ManifestError(
                f"{dataset.shown()}: this view was made of version {version} of "
                f"{view.get('source', source.shown())}, which is gone (`shardstream prune`), "
                f"and {len(missing)} of the files it reads went with it, such as "
                f"{store.shown(missing[0])}; make the view again from the dataset's current "
                "version (`shardstream view SOURCE DEST ...`, the same selection)"
            )
