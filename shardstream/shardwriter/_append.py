"""What an append must match before it writes anything: the dataset's samples and names.

Each check raises with the first mismatch: the item, what the dataset holds and what the
source would add, and what to do. They run before the append's plan file is written, so a
refused append leaves DEST exactly as it was.

Appending to a dataset: new shards after its shards, then a new version published last.

``build_shards(SOURCE, DATASET, append=True)`` runs like a build (the same plan, chunk tasks
and build state in ``DATASET/_shardstream_build``) with these differences:

1. before anything is written, the source is checked against the dataset
   (:mod:`shardstream.shardwriter._append`) and an empty source publishes nothing;
2. the plan file is created exclusively (a hard link locally, ``If-None-Match: *`` on S3) and
   records the version appended to, so a second append started meanwhile is refused;
3. the parts become ``shard-N.tar`` ... numbered after the dataset's shards (a name that
   exists already is refused, never overwritten);
4. the new version is published with :func:`shardstream._catalog.versions.publish_version`:
   versioned files first, ``manifest.json`` replaced last.

A killed append leaves the old version readable; the same command run again finishes it, and
once it has finished, reports that there is nothing to do (it recognises its own source in
the newest version's settings).

Abandoning an unfinished append (or exclude, or compact): remove what it wrote, so the next
one starts clean.

An append killed part-way (see :mod:`shardstream.shardwriter._append`) is finished by running
the same command again. When that is not wanted (its source is gone, or was the wrong one),
:func:`abandon_append` removes what it left: its build state (``DATASET/_shardstream_build``),
the shards and indexes it had already renamed into the dataset (``shard-N.tar`` numbered after
the published version's shards, listed by no version), a versioned manifest (and its sidecars)
newer than the published one, the rewritten shards of a killed ``compact``
(``compacted/vN/``, listed by no version), and temporaries; timm's ``_info.json`` is written
again when it named the abandoned shards. The published version, and every shard it lists,
stay as they are."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

from shardstream._catalog.versions import (
    list_versions,
    publish_version,
    published_version,
    read_version,
    version_name,
)
from shardstream._format import codecs
from shardstream._format.codecs import PIXELS_EXTENSION
from shardstream._format.inspection import TIMM_INFO_NAME, timm_info_json, write_timm_info
from shardstream._format.manifest import Manifest, SkippedSample, read_manifest
from shardstream._format.shardindex import index_name
from shardstream._format.shardtable import ShardTable
from shardstream._format.tarreader import iter_samples, open_tar
from shardstream._storage import StorageOptions, Store
from shardstream._storage.store import destination_lock
from shardstream._version import __version__
from shardstream.errors import ConfigError, DatasetExistsError, ManifestNotFoundError, SourceError
from shardstream.shardwriter import _state as state
from shardstream.shardwriter._compact import COMPACTED_FOLDER
from shardstream.shardwriter._sources import LIST_SUFFIXES, ScannedSource, scan_source
from shardstream.shardwriter._state import ProgressCallback, plan_chunks, shard_name, write_chunks
from shardstream.shardwriter._tasks import BuildOptions, ChunkResult, normalized_extension

__all__ = [
    "abandon_append",
    "append_source",
    "check_appendable",
    "check_names_free",
    "check_new_source",
    "is_empty",
    "source_history",
]


def is_empty(path: str) -> bool:
    """Whether a folder holds no (visible) files, or a list file no rows."""
    if os.path.isdir(path):
        for _, _, names in os.walk(path):
            if any(not name.startswith(".") for name in names):
                return False
        return True
    if os.path.isfile(path) and path.lower().endswith(LIST_SUFFIXES):
        with open(path, "rb") as stream:
            rows = [line for line in itertools.islice(stream, 2) if line.strip()]
        return len(rows) <= (1 if path.lower().endswith(".csv") else 0)  # a CSV has a header
    return False  # not a source at all: scanning it says why


def source_history(dest: Store, base: Manifest) -> dict[str, int]:
    """Each source fingerprint the dataset's versions up to ``base`` record, with the first
    version that holds it.

    Versions record the history of the ones before them (``source_history``), so it survives
    ``prune``; for a dataset whose versions predate that, the versioned manifests still there
    are read once (their settings, which come first in the file).
    """
    recorded = base.settings.get("source_history")
    history: dict[str, int] = {}
    if isinstance(recorded, dict):
        history.update((str(key), int(value)) for key, value in recorded.items())
    else:
        for version in list_versions(dest):
            if version < base.version and dest.exists(version_name(version)):
                settings = json.loads(dest.read_bytes(version_name(version))).get("settings")
                fingerprint = (settings or {}).get("source_fingerprint")
                if fingerprint:
                    history.setdefault(str(fingerprint), version)
    fingerprint = base.settings.get("source_fingerprint")
    if fingerprint:
        history.setdefault(str(fingerprint), base.version)
    return history


def check_new_source(
    dest: Store, source_path: str, fingerprint: str, history: dict[str, int]
) -> None:
    """Refuse a source that a version of the dataset already holds.

    Raises:
        SourceError: Names the version that holds it.
    """
    version = history.get(fingerprint)
    if version is None:
        return
    raise SourceError(
        f"{source_path}: version {version} of {dest.shown()} already holds this source (the "
        "same files, keys, labels and sizes); appending it again would put each of its "
        "samples in the dataset twice, so nothing was written. To add new samples, append a "
        "folder or list of only them; to read some data more often, mix datasets with "
        "Stream(..., repeat=...)."
    )


def check_appendable(
    dest: Store, base: Manifest, scanned: ScannedSource, options: BuildOptions
) -> None:
    """Refuse an append whose samples differ from the dataset's (first mismatch named).

    Raises:
        ConfigError: The dataset is a view or describes shards stored elsewhere.
        SourceError: Another shard format, other member extensions or another label type.
    """
    shown = dest.shown()
    if base.view is not None or base.shard_root is not None or base.index_root is not None:
        raise ConfigError(
            f"{shown}: is a view or an index of shards stored elsewhere; append to the dataset "
            "that holds the shards, then make the view again"
        )
    first = base.shards[0]
    if not first.name.endswith(".tar") or first.index is None:
        raise SourceError(
            f"{shown}: its shards are in another shard format ({first.name}, "
            f"{'with' if first.index else 'without'} a per-sample index) than an append writes "
            "(uncompressed .tar with an index); build a new dataset from both sources instead"
        )
    if scanned.class_names != base.class_names:
        raise SourceError(f"{shown}: labels differ: {_label_difference(base, scanned)}")
    _check_members(dest, base, scanned, options)


def _label_difference(base: Manifest, scanned: ScannedSource) -> str:
    old, new = base.class_names, scanned.class_names
    if old is None or new is None:
        kinds = ("class names", "no class names (integer labels or none)")
        return (
            f"the dataset has {kinds[old is None]}, the source has {kinds[new is None]}; "
            "append a source labelled the same way"
        )
    for position, (before, after) in enumerate(itertools.zip_longest(old, new)):
        if before != after:
            return (
                f"class {position} is {before!r} in the dataset but {after!r} in the source "
                f"(the dataset has {len(old)} classes, the source {len(new)}); label i must "
                "mean the same class in every version, so give the source the same class "
                "folders (an empty folder keeps a class's place)"
            )
    return "the class names differ"  # pragma: no cover - equal tuples never get here


def _check_members(
    dest: Store, base: Manifest, scanned: ScannedSource, options: BuildOptions
) -> None:
    """Image types (JPEG only, when the dataset was re-encoded) and the other members."""
    images = codecs.IMAGE_EXTENSIONS | {PIXELS_EXTENSION}
    others = _first_sample_members(dest, base.shards[0].name) - images
    jpeg_only = base.settings.get("resize") is not None or base.settings.get("quality") is not None
    # Pixel datasets take pixels (at any size: the reader's crop adapts), and only them.
    pixels_only = base.settings.get("pixels") is not None
    table = scanned.table
    for index in range(len(table)):
        path = table.path(index)
        image = _image_member(path, options)
        members = {"cls"} if int(table.labels[index]) >= 0 else set()
        if table.extra(index):
            members.add("json")
        if (
            members != others
            or (jpeg_only and image != "jpg")
            or (pixels_only != (image == PIXELS_EXTENSION))
        ):
            kind = PIXELS_EXTENSION if pixels_only else "jpg" if jpeg_only else "an image"
            expected = sorted(others | {kind})
            raise SourceError(
                f"{os.path.join(table.root, path)}: would be a sample with members "
                f"{sorted({image, *members})}, but the samples of {dest.shown()} have "
                f"{expected} (read from its {base.shards[0].name}); append samples of the same "
                "kind (labels and extra fields as the dataset has, --resize or --quality "
                "when the dataset was re-encoded to JPEG, --pixels when it stores pixels)"
            )


def _image_member(path: str, options: BuildOptions) -> str:
    if options.pixels is not None:
        return PIXELS_EXTENSION
    return "jpg" if options.reencodes else normalized_extension(path)


def _first_sample_members(dest: Store, name: str) -> set[str]:
    with dest.open_read(name) as stream:
        sample, _ = next(iter_samples(open_tar(stream, dest.shown(name)), want_data=False))
    return {key for key in sample if not key.startswith("__")}


def check_names_free(
    dest: Store, base: Manifest, first: int, num_shards: int, resuming: bool
) -> None:
    """Refuse an append whose shard names exist already (unless this append wrote them).

    Raises:
        DatasetExistsError: Names the first shard that would be overwritten.
    """
    taken = set(base.shards.names)
    present = set() if resuming else set(dest.list_names())
    for number in range(first, first + num_shards):
        for name in (shard_name(number), index_name(shard_name(number))):
            if name in taken or name in present:
                raise DatasetExistsError(
                    f"{dest.shown(name)}: exists already, and the append would write its shard "
                    f"number {number} there (after the dataset's {first} shards); no published "
                    "version lists it. If an append into this dataset was killed and is not to "
                    f"be finished, `shardstream abandon {dest.shown()}` removes what it left; "
                    "otherwise move that file away."
                )


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
    if plan.get("on_error") == "raise" and settings.get("on_error") == "skip":
        # An append stopped by a broken item goes on skipping such items, as its message says
        # (as a build does): the shards written so far hold no skipped item either way.
        plan = {**plan, "on_error": "skip"}
        if {**_comparable(plan), "append_to": plan.get("append_to")} == mine:
            logger.info("%s: finishing the append with on_error='skip'", dest.shown())
            with state_store.open_atomic_write(state.PLAN_NAME) as stream:
                stream.write(json.dumps(settings, sort_keys=True).encode("utf-8"))
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
