"""What ``index`` refuses or warns about once every shard was scanned: what breaks exactness
(unreadable shards, samples split across shards, keys that come back, stray members) and
gzipped shards, which are counted but cannot be read by byte range.

Indexing a folder of other tools' shards again after it gained shards: only the new ones.

The dataset's manifest lists the shards it indexed, in listing order. When the listing now
holds those same names first and more after them, only the new shards are read; the new
version lists the old shards unchanged (names, counts, checksums, indexes) followed by the new
ones, and is published like an append (:func:`shardstream._catalog.versions.publish_version`).

``index_shards``: describe shards made by other tools in place, without changing a byte.

WebDataset shards from ``webdataset``'s ShardWriter, img2dataset or ``tar`` stream through
shardstream as they are, but without counts nothing can be exact. Indexing reads every shard
once with the streaming reader's own parser (:func:`~shardstream._format.verify.scan_shard`) and
writes what counted datasets have: a per-shard index (byte offsets and key hashes), the manifest
(written last) and timm's ``_info.json``. Then every guarantee holds on those shards: ``len``,
exact equal epochs, memory-mapped reads, resume at any world size, mixtures, views, ``verify``.

The metadata goes next to the shards, or into DEST (a read-only bucket...), whose manifest then
names the shards' root. Shards are read in batches by parallel tasks (processes, or any
executor); each leaves a record in DEST's ``_shardstream_index``: a killed run goes on."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import itertools
import json
import logging
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from shardstream._catalog.execute import run_tasks
from shardstream._catalog.shardlist import Source, resolve_source
from shardstream._catalog.versions import publish_version
from shardstream._format.inspection import write_timm_info
from shardstream._format.manifest import (
    MANIFEST_NAME,
    Manifest,
    absolute_root,
    read_manifest,
    write_manifest,
)
from shardstream._format.shardindex import decode_index, encode_offsets, index_name
from shardstream._format.shardtable import ShardInfo, ShardTable
from shardstream._format.tarreader import is_gzip_name
from shardstream._format.verify import scan_shard
from shardstream._storage import Store
from shardstream._storage.store import destination_lock
from shardstream._version import __version__
from shardstream.errors import ConfigError, DatasetExistsError, ShardFormatError, SourceError

__all__ = [
    "IndexOptions",
    "STATE_FOLDER",
    "index_shards",
    "log_compressed",
    "new_shards",
    "refuse_inexact",
]


logger = logging.getLogger("shardstream.catalog.indexer")

STATE_FOLDER = "_shardstream_index"


def refuse_inexact(
    records: dict[int, dict[str, Any]], shards: Store, target: Store, allow_extra_members: bool
) -> None:
    """Raise, listing them, on what would break exact epochs; forget the unreadable shards'
    batches, so that a run after fixing them reads them again."""
    entries = [entry for number in sorted(records) for entry in records[number]["entries"]]
    problems: list[str] = []
    for entry in entries:
        problems += entry["problems"]
        if entry["skipped"] and not allow_extra_members:
            problems.append(
                f"{shards.shown(entry['name'])}: {entry['skipped']} file member(s) that belong to "
                f"no sample (other readers may read them otherwise), such as "
                f"{entry['skipped_example']!r}"
            )
    for before, after in itertools.pairwise(entries):
        if before["last_key"] and before["last_key"] == after["first_key"]:
            problems.append(
                f"sample {before['last_key']!r} is split across {before['name']} and "
                f"{after['name']}: readers would see two samples"
            )
    if problems:
        kept = _forget_unreadable(records, target)
        shown = "\n  ".join(problems[:10]) + ("\n  ..." if len(problems) > 10 else "")
        back = any("comes back" in problem for problem in problems)
        hint = " Shards made with GNU tar keep a sample's files together with `tar --sort=name`."
        hint = hint if back else ""
        raise SourceError(
            f"{shards.shown()}: {len(problems)} problem(s) would break exact epochs:\n  {shown}\n"
            "Fix or leave out those shards (or pass allow_extra_members=True when only "
            f"members outside samples are listed), then run the same command again.{hint}{kept}"
        )


def _forget_unreadable(records: dict[int, dict[str, Any]], target: Store) -> str:
    """Forget the batches with problems (their indexes too, where no manifest names them), so
    that a run after fixing them reads them again; remove the run's state when nothing else
    is left to resume. Returns what the message says about the batches kept."""
    state = target.child(STATE_FOLDER)
    fresh = not target.exists(MANIFEST_NAME)  # else an index may be the manifest's
    for number, record in list(records.items()):
        if any(entry["problems"] for entry in record["entries"]):
            state.remove(f"task-{number:06d}.json")
            del records[number]
            for index in (entry["index"] for entry in record["entries"] if fresh):
                if index:
                    target.remove(index)
    if not records:
        state.remove_folder()
        return ""
    done = sum(len(record["entries"]) for record in records.values())
    return (
        f" The {done} shard(s) read without problems are remembered in "
        f"{state.shown()}, so that run reads only the others."
    )


def log_compressed(entries: list[dict[str, Any]], target: Store) -> None:
    compressed = [entry["name"] for entry in entries if is_gzip_name(entry["name"])]
    if compressed:
        logger.warning(
            "%s: %d gzipped shard(s) such as %s are counted but cannot be read by byte range "
            "(each piece reads its shard from the start); re-pack them as plain .tar for "
            "ranged reads and memory maps", target.shown(), len(compressed), compressed[0],
        )  # fmt: skip


_COMPACTED = re.compile(r"compacted/v\d{6,}/")


def new_shards(
    target: Store, names: list[str], overwrite: bool
) -> tuple[Manifest | None, list[str]]:
    """The indexed dataset in ``target`` (None: index from scratch) and the names to index.

    Raises:
        DatasetExistsError: ``target`` holds a built (not indexed) dataset, or the listing no
            longer starts with the indexed shards (names the first difference).
    """
    if overwrite or not target.exists(MANIFEST_NAME):
        return None, names
    base = read_manifest(target)
    shown = target.shown()
    if not base.settings.get("indexed"):
        raise DatasetExistsError(
            f"{shown}: already holds a dataset built by `shardstream build`; add samples to it "
            "with `shardstream build SOURCE DATASET --append`, or pass overwrite=True "
            "(--overwrite) to index the shards from scratch"
        )
    # Shards `compact` rewrote are listed under compacted/vN/: their first names, still in the
    # folder until `prune` removes them, are neither indexed shards nor new ones.
    old = [name for name in base.shards.names if _COMPACTED.match(name) is None]
    replaced = {name[match.end() :] for name in base.shards.names
                if (match := _COMPACTED.match(name)) is not None}  # fmt: skip
    names = [name for name in names if name not in replaced]
    for number, name in enumerate(old):
        found = names[number] if number < len(names) else None
        if found != name:
            raise DatasetExistsError(
                f"{shown}: its manifest lists {name} as shard {number}, but the listing now has "
                f"{found or 'no shard there'}: shards were removed or renamed, or new ones sort "
                "before old ones. Name new shards so that they sort after the indexed ones, or "
                "pass overwrite=True (--overwrite) to index every shard again (new numbering)."
            )
    return base, names[len(old) :]


_PLAN = "plan.json"


@dataclasses.dataclass(frozen=True)
class IndexOptions:
    """Settings of :func:`index_shards`.

    Attributes:
        workers: Parallel processes (ignored with an executor, which bounds itself).
        checksum: Compute every shard's sha256 and every sample's content digest (reads every
            byte; without it a local shard's member data is skipped over, ``verify`` cannot
            check bytes and ``dups`` has no digests to compare).
        allow_extra_members: Accept file members that belong to no sample (names without an
            extension, dotfiles, ``__MACOSX/``...), which shardstream skips but other readers
            may not. Directories and links are always accepted: every reader skips them.
        shards_per_task: Shards one task reads (and one state record describes).
        overwrite: Index again where a manifest already is.
        split: timm's split name in ``_info.json``.
    """

    workers: int = 1
    checksum: bool = True
    allow_extra_members: bool = False
    shards_per_task: int = 64
    overwrite: bool = False
    split: str = "train"


@dataclasses.dataclass(frozen=True)
class _Task:
    number: int
    first: int
    names: tuple[str, ...]
    shards: Store
    dest: Store
    checksum: bool


def _index_task(task: _Task) -> dict[str, Any]:
    """Scan a batch of shards, write their indexes, and record what was found (last)."""
    entries = []
    for name in task.names:
        with task.shards.open_read(name) as stream:
            scan = scan_shard(stream, task.shards.shown(name), task.checksum)
        index = None
        if scan.offsets is not None and not scan.problems:
            index = index_name(name)
            _write_index(task.dest, index, scan.offsets, scan.key_hashes, scan.digests)
        entry = {
            "name": name, "num_samples": scan.num_samples, "num_bytes": scan.num_bytes,
            "sha256": scan.sha256, "index": index, "first_key": scan.first_key,
            "last_key": scan.last_key, "skipped": scan.stray_files,
            "skipped_example": scan.skipped_example, "problems": scan.problems,
        }  # fmt: skip
        entries.append(entry)
    record = {"number": task.number, "first": task.first, "entries": entries}
    with task.dest.child(STATE_FOLDER).open_atomic_write(f"task-{task.number:06d}.json") as out:
        out.write(json.dumps(record).encode("utf-8"))
    return record


def _write_index(
    dest: Store, name: str, offsets: Sequence[int], keys: Sequence[int], digests: bytes | None
) -> None:
    """Write an index, refusing to replace a file that is not a shardstream index (DALI's...)."""
    if dest.exists(name):
        try:
            decode_index(dest.read_bytes(name), dest.shown(name))
        except ShardFormatError as error:
            raise DatasetExistsError(
                f"{dest.shown(name)}: exists and is not a shardstream index (a DALI index?); "
                "write the metadata elsewhere: index SOURCE DEST"
            ) from error
    with dest.open_atomic_write(name) as stream:
        stream.write(encode_offsets(offsets, keys, digests))


ProgressCallback = Callable[[int, int, "int | None", "int | None"], None]


def index_shards(
    source: Source,
    dest: str | os.PathLike[str] | None = None,
    options: IndexOptions | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    executor: cf.Executor | None = None,
    progress: ProgressCallback | None = None,
    **overrides: Any,
) -> Manifest:
    """Index existing shards: per-shard indexes, ``manifest.json`` and timm's ``_info.json``.

    Args:
        source: A folder of ``.tar``/``.tar.gz`` shards, a manifest file, a brace pattern, a
            ``.txt`` list of shard URLs or a list of URLs (see :func:`resolve_source`).
        dest: Where the metadata goes (default: next to the shards). DEST's manifest then
            names the shards where they are.
        options: See :class:`IndexOptions`.
        storage_options: fsspec options for remote URLs.
        executor: Runs the tasks, e.g. ``distributed.Client(...).get_executor()``.
        progress: Called after each task with shards and bytes done, and the shard total.
        **overrides: Any :class:`IndexOptions` field, e.g. ``workers=8``.

    Returns:
        The manifest written.

    Raises:
        SourceError: What breaks exactness, listed: a shard that does not read, a sample split
            across two shards, a key that comes back after other keys, members that belong to
            no sample (unless ``allow_extra_members``).
        DatasetExistsError: DEST holds a manifest (pass ``overwrite``) or a foreign ``.idx``.
        ConfigError: The metadata cannot be written next to the shards (give DEST).

    Examples:
        >>> manifest = index_shards("s3://bucket/laion/{00000..09999}.tar", "s3://mine/laion",
        ...                         workers=16)  # doctest: +SKIP
    """
    options = dataclasses.replace(options or IndexOptions(), **overrides)
    _, listed, _ = resolve_source(source, storage_options, list_folder=True)
    shards, names = listed.sources[0].shards, listed.names()
    target = shards if dest is None else Store(dest, storage_options)
    with destination_lock(target, "index"):
        base, names = new_shards(target, names, options.overwrite)
        if base is not None and not names:
            logger.warning("%s: no new shards; nothing indexed", target.shown())
            return base
        return _index(shards, names, target, dest is None, options, executor, progress, base)


def _index(
    shards: Store,
    names: list[str],
    target: Store,
    in_place: bool,
    options: IndexOptions,
    executor: cf.Executor | None,
    progress: ProgressCallback | None,
    base: Manifest | None = None,
) -> Manifest:
    _prepare(target, shards, names, options, in_place, growing=base is not None)
    records = _load_records(target, len(names), options.shards_per_task)
    done_bytes = [sum(e["num_bytes"] for r in records.values() for e in r["entries"])]

    def on_result(record: dict[str, Any] | None) -> None:
        if record is not None:
            records[record["number"]] = record
            done_bytes[0] += sum(entry["num_bytes"] for entry in record["entries"])
        if progress is not None:
            done = sum(len(r["entries"]) for r in records.values())
            progress(done, done_bytes[0], len(names), None)

    def tasks() -> Iterator[_Task]:
        for number, first in enumerate(range(0, len(names), options.shards_per_task)):
            if number not in records:
                batch = tuple(names[first : first + options.shards_per_task])
                yield _Task(number, first, batch, shards, target, options.checksum)

    on_result(None)  # the total shows at once (and a resumed run's part)
    run_tasks(_index_task, tasks(), on_result, options.workers, executor)
    refuse_inexact(records, shards, target, options.allow_extra_members)
    entries = [entry for number in sorted(records) for entry in records[number]["entries"]]
    root = None if in_place else absolute_root(shards)
    manifest = Manifest(
        shards=ShardTable.of([*(base.shards if base else ()), *map(_info, entries)]),
        settings={
            "indexed": True,
            "checksum": options.checksum,
            "source": shards.shown(),
            "allow_extra_members": options.allow_extra_members,
        },
        created_by=f"shardstream {__version__} index",
        shard_root=root,
        version=base.version + 1 if base else 1,
        exclusions=base.exclusions if base else None,
        columns=base.columns if base else None,
    )
    if in_place:  # timm reads shard names relative to _info.json's folder
        write_timm_info(target, manifest, split=options.split)
    if base is None:
        write_manifest(target, manifest)
    else:  # the folder gained shards: a new version, published last
        publish_version(target, manifest)
    target.child(STATE_FOLDER).remove_folder()
    log_compressed(entries, target)
    return manifest


def _prepare(
    target: Store,
    shards: Store,
    names: list[str],
    options: IndexOptions,
    in_place: bool,
    growing: bool = False,
) -> None:
    """Refuse a DEST that already holds a manifest (unless ``growing``: it gained shards);
    start or continue the recorded run."""
    if target.exists(MANIFEST_NAME) and not options.overwrite and not growing:
        raise DatasetExistsError(
            f"{target.shown()}: already holds a manifest; pass overwrite=True (--overwrite) to "
            "index the shards again"
        )
    plan = {"source": shards.shown(), "num_shards": len(names), "first": names[0],
            "last": names[-1], "checksum": options.checksum,
            "shards_per_task": options.shards_per_task}  # fmt: skip
    state = target.child(STATE_FOLDER)
    try:
        found = json.loads(state.read_bytes(_PLAN))
    except (FileNotFoundError, ValueError):
        found = None
    if found is not None and found != plan:
        if not options.overwrite:
            raise DatasetExistsError(
                f"{target.shown()}: holds an unfinished index of other shards or settings; run "
                "the same command again to finish it, or pass overwrite=True to start over"
            )
        state.remove_folder()
    try:
        state.makedirs()
        with state.open_atomic_write(_PLAN) as stream:
            stream.write(json.dumps(plan, sort_keys=True).encode("utf-8"))
    except PermissionError as error:
        hint = "give DEST, a folder or URL you can write" if in_place else "check DEST"
        raise ConfigError(f"cannot write the index metadata to {target.shown()}: {hint}") from error


def _load_records(target: Store, num_shards: int, per_task: int) -> dict[int, dict[str, Any]]:
    """The batches a killed run finished (their records are written after their indexes)."""
    state = target.child(STATE_FOLDER)
    records: dict[int, dict[str, Any]] = {}
    for name in state.list_names():
        if name.startswith("task-") and name.endswith(".json"):
            record = json.loads(state.read_bytes(name))
            if record["first"] == record["number"] * per_task < num_shards:
                records[int(record["number"])] = record
    return records


def _info(entry: dict[str, Any]) -> ShardInfo:
    return ShardInfo(
        entry["name"], entry["num_samples"], entry["num_bytes"], entry["sha256"], entry["index"]
    )
