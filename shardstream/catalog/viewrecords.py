"""Which views read a dataset's files: records that ``prune`` reads, and the check a view's
reader makes when the version it was made of is gone.

A view reads its source's shard, index and field files where they are. Making one leaves a
record in the source (``_shardstream_views/<hash>.json``: the view's location and the version it
was made of), when the source can be written; ``prune`` names the recorded views whose files it
would remove. Opening a view whose source version was pruned checks that its files are still
there, and refuses at once, naming the view and a missing file, rather than failing on a
missing file inside a DataLoader worker.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable, Sequence

from shardstream.catalog.versions import published_version, version_name
from shardstream.errors import ManifestError, ShardstreamError
from shardstream.format.columns import column_file
from shardstream.format.manifest import MANIFEST_NAME, Manifest, read_manifest
from shardstream.format.roots import absolute_root, root_store
from shardstream.storage import Store

__all__ = ["VIEWS_FOLDER", "check_view_files", "record_view", "views_reading"]

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
