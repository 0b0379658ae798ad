"""Build state in DEST: what makes a killed build resumable and a finished one idempotent.

Layout while a build runs::

    DEST/_shardstream_build/plan.json              settings + source fingerprint
    DEST/_shardstream_build/chunk-000012-000.tar    a chunk's shard, under its part name
    DEST/_shardstream_build/chunk-000012-000.idx    its byte-offset index, written after it
    DEST/_shardstream_build/chunk-000012.json       written after the chunk's parts: it is done

When every chunk is done, parts (and their indexes) are renamed in plan order to
``DEST/shard-000000.tar`` (``.idx``)..., the manifest is written last, and the state folder is
removed (timm's ``_info.json`` goes just before the manifest and counts as part of the
dataset). Temporary names never match ``shard-*``, and a part counts only when its chunk record
exists, its size matches and its index exists. A re-run also removes what a build killed in its
last steps leaves behind: a temporary of ``manifest.json`` in DEST, and the state folder once
the manifest is there.

Writing a planned build's chunks into DEST's build state, resuming what a killed run did.

Planning: a seeded global order, cut into chunks that each become one shard (or more).

With pass-through bytes the tar size of every sample is known from the scan (stat sizes and
key lengths), so each chunk fits the limits exactly and becomes exactly one shard. With
re-encoding the original size serves as an estimate; the task that writes a chunk rolls into a
further shard if the encoded samples do not fit. Either way the plan depends only on the
listing and the options, never on the number of workers."""

from __future__ import annotations

import concurrent.futures as cf
import fnmatch
import itertools
import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from shardstream._catalog.execute import run_tasks
from shardstream._format.inspection import TIMM_INFO_NAME
from shardstream._format.manifest import MANIFEST_NAME, Manifest, ShardInfo, read_manifest
from shardstream._format.shardindex import index_name
from shardstream._format.tarformat import BLOCK, END_BYTES, member_size
from shardstream._storage import Store
from shardstream._storage.store import LOCK_NAME
from shardstream.errors import DatasetExistsError, ManifestError
from shardstream.shardwriter._records import FileTable
from shardstream.shardwriter._tasks import BuildOptions, ChunkResult, ChunkTask, write_chunk

__all__ = [
    "ProgressCallback",
    "STATE_FOLDER",
    "Tracker",
    "cut_chunks",
    "finalize_shards",
    "load_chunk_records",
    "plan_chunks",
    "prepare_destination",
    "read_plan",
    "remove_state",
    "remove_temporaries",
    "sample_order",
    "sample_tar_sizes",
    "shard_name",
    "write_chunks",
]


logger = logging.getLogger(__name__)

STATE_FOLDER = "_shardstream_build"
PLAN_NAME = "plan.json"
SHARD_PATTERN = "shard-*.tar"
INDEX_PATTERN = "shard-*.idx"
#: Settings that may differ between runs without changing the output.
_IGNORED_SETTINGS = frozenset({"source_path"})


def shard_name(index: int) -> str:
    """Final shard name: ``shard-000000.tar`` (brace pattern ``shard-{000000..000041}.tar``)."""
    return f"shard-{index:06d}.tar"


def _is_ours(name: str) -> bool:
    return (
        name in (MANIFEST_NAME, TIMM_INFO_NAME)
        or fnmatch.fnmatch(name, "manifest.v*.json")
        or fnmatch.fnmatch(name, "manifest.v*.shards")
        or fnmatch.fnmatch(name, SHARD_PATTERN)
        or fnmatch.fnmatch(name, INDEX_PATTERN)
    )


def _comparable(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in _IGNORED_SETTINGS}


def prepare_destination(
    dest: Store, settings: dict, overwrite: bool, reuse_finished: bool = True
) -> Manifest | None:
    """Check DEST and start or resume a build; return the finished manifest if already built.

    ``reuse_finished=False`` (sources that cannot be compared with a finished dataset, such as
    iterables) never returns a finished manifest: with ``overwrite`` DEST is cleared.

    Raises:
        DatasetExistsError: DEST holds another dataset, another unfinished build, or unrelated
            files, and ``overwrite`` is false.
    """
    state = dest.child(STATE_FOLDER)
    names = [name for name in dest.list_names() if name != LOCK_NAME]  # this run's own lock
    if MANIFEST_NAME in names:
        manifest = _read_existing(dest)
        if (
            manifest is not None
            and reuse_finished
            and _comparable(dict(manifest.settings)) == _comparable(settings)
        ):
            logger.info("%s: already built with these settings; nothing to do", dest.shown())
            # A build killed between its manifest and the state's removal left the state.
            _remove_temporaries(dest, names)
            remove_state(state)
            return manifest
        if not overwrite:
            raise DatasetExistsError(
                f"{dest.shown()}: already holds a dataset ({_describe(manifest)}) built with other "
                f"settings or another source (differences: {_differences(manifest, settings)}). "
                "Choose another destination, pass append=True (--append) to add the source's "
                "samples to it, or overwrite=True (--overwrite) to replace it."
            )
    plan = read_plan(state)
    if plan is not None and _skips_now(plan, settings) and not overwrite:
        # A build stopped by a broken item goes on skipping such items: the shards written
        # so far hold no skipped item either way, so the output is what a skipping build makes.
        logger.info("%s: finishing the build with on_error='skip'", dest.shown())
        with state.open_atomic_write(PLAN_NAME) as stream:
            stream.write(json.dumps(settings, sort_keys=True).encode("utf-8"))
        plan = dict(settings)
    if plan is not None and _comparable(plan) != _comparable(settings) and not overwrite:
        raise DatasetExistsError(
            f"{dest.shown()}: holds an unfinished build with other settings or another source "
            f"(differences: {_differences_plain(plan, settings)}). Re-run with the same "
            "arguments to finish it, or pass overwrite=True (--overwrite) to start over."
        )
    _check_foreign_files(dest.shown(), names, resuming=plan is not None, overwrite=overwrite)
    if overwrite:
        _clear(dest, names, state)
        plan = None
    else:
        _remove_temporaries(dest, names)
    if plan is None:
        state.makedirs()
        with state.open_atomic_write(PLAN_NAME) as stream:
            stream.write(json.dumps(settings, sort_keys=True).encode("utf-8"))
    return None


def _skips_now(plan: dict, settings: dict) -> bool:
    """Whether the only difference is ``on_error``: ``"raise"`` in the plan, ``"skip"`` now."""
    if plan.get("on_error") != "raise" or settings.get("on_error") != "skip":
        return False
    return _comparable({**plan, "on_error": "skip"}) == _comparable(settings)


def _read_existing(dest: Store) -> Manifest | None:
    try:
        return read_manifest(dest)
    except ManifestError:
        return None


def _describe(manifest: Manifest | None) -> str:
    if manifest is None:
        return "an unreadable manifest.json"
    grown = f"version {manifest.version}: " if manifest.version > 1 else ""
    return f"{grown}{manifest.num_samples} samples in {len(manifest.shards)} shards"


def _differences(manifest: Manifest | None, settings: dict) -> str:
    return "unknown" if manifest is None else _differences_plain(dict(manifest.settings), settings)


def _differences_plain(found: dict, expected: dict) -> str:
    keys = sorted(
        k
        for k in set(found) | set(expected) - _IGNORED_SETTINGS
        if found.get(k) != expected.get(k) and k not in _IGNORED_SETTINGS
    )
    return ", ".join(f"{k}: found {found.get(k)!r}, asked {expected.get(k)!r}" for k in keys)


def read_plan(state: Store) -> dict | None:
    """The settings a started build or append recorded, or None."""
    try:
        return dict(json.loads(state.read_bytes(PLAN_NAME)))
    except (FileNotFoundError, ValueError):
        return None


def _check_foreign_files(dest: str, names: list[str], resuming: bool, overwrite: bool) -> None:
    ours = [n for n in names if _is_ours(n)]
    foreign = [n for n in names if n not in ours and ".tmp-" not in n]
    if foreign and not overwrite:
        shown = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "")
        raise DatasetExistsError(
            f"{dest}: is not empty and holds files that are not part of a shardstream dataset "
            f"({shown}). Choose an empty or new destination, or pass overwrite=True "
            "(--overwrite) to write the dataset there anyway."
        )
    if foreign:
        logger.warning("%s: leaving %d unrelated files in place", dest, len(foreign))
    if ours and not resuming and not overwrite:
        raise DatasetExistsError(
            f"{dest}: holds shard files but no manifest and no build state ({ours[0]}, ...): "
            "another or a damaged dataset. Remove them, choose another destination, or pass "
            "overwrite=True (--overwrite)."
        )


def _clear(dest: Store, names: list[str], state: Store) -> None:
    for name in names:
        if _is_ours(name) or ".tmp-" in name:
            dest.remove(name)
    remove_state(state)


def remove_temporaries(dest: Store) -> None:
    """Delete what killed atomic writes left in DEST (local temporaries of manifests)."""
    _remove_temporaries(dest, dest.list_names())


def _remove_temporaries(dest: Store, names: list[str]) -> None:
    """Delete the temporaries of a killed build's unfinished atomic writes (its manifest)."""
    for name in names:
        if ".tmp-" in name:
            dest.remove(name)


def load_chunk_records(state: Store, num_chunks: int) -> dict[int, ChunkResult]:
    """Chunk records of a resumed build whose parts are all present; removes stale temps."""
    records: dict[int, ChunkResult] = {}
    for name in state.list_names():
        if ".tmp-" in name:
            state.remove(name)
        elif name.startswith("chunk-") and name.endswith(".json"):
            text = state.read_bytes(name)
            record = ChunkResult.from_json(text)
            if record.index < num_chunks:
                records[record.index] = record
    return records


def _part_present(dest: Store, state: Store, part: ShardInfo, final: str) -> bool:
    """The part exists with its recorded size (still in the state, or renamed to ``final``)."""
    if part.index is not None and not (state.exists(part.index) or dest.exists(index_name(final))):
        return False
    return _has_size(state, part.name, part.num_bytes) or _has_size(dest, final, part.num_bytes)


def _has_size(store: Store, name: str, num_bytes: int) -> bool:
    return store.exists(name) and store.size(name) == num_bytes


def final_names(results: list[ChunkResult], first: int = 0) -> list[tuple[ShardInfo, str]]:
    """Each part with its final shard name, numbered in plan order from ``first``."""
    parts = [shard for result in sorted(results, key=lambda r: r.index) for shard in result.shards]
    return [(part, shard_name(first + index)) for index, part in enumerate(parts)]


def drop_incomplete(
    dest: Store, state: Store, records: dict[int, ChunkResult], num_chunks: int, first: int = 0
) -> dict[int, ChunkResult]:
    """Keep only records whose parts all exist with the recorded size (in state or renamed).

    ``first``: the number of the first shard the build writes (an append's: after the others).
    """
    if len(records) == num_chunks:  # every chunk was done: parts may already be renamed
        bad: set[int] = set()
        ordered = sorted(records.values(), key=lambda r: r.index)
        finals = iter(final_names(ordered, first))
        for result in ordered:
            for part, final in (next(finals) for _ in result.shards):
                if not _part_present(dest, state, part, final):
                    bad.add(result.index)
        return {i: r for i, r in records.items() if i not in bad}
    return {
        index: result
        for index, result in records.items()
        if all(_part_in_state(state, part) for part in result.shards)
    }


def _part_in_state(state: Store, part: ShardInfo) -> bool:
    if not _has_size(state, part.name, part.num_bytes):
        return False
    return part.index is None or state.exists(part.index)


#: Moves at once when finalizing on an object store: each is a server-side copy and a delete,
#: so at 1e5 shards one at a time would take hours of round trips.
FINALIZE_THREADS = 16


def finalize_shards(
    dest: Store, state: Store, results: list[ChunkResult], first: int = 0
) -> list[ShardInfo]:
    """Rename every part to its final shard name in plan order; return the final ShardInfos.

    Shards are numbered from ``first`` (an append continues after the dataset's shards).

    Local renames run one after another; on object stores (``CopyObject`` + delete, server
    side) up to :data:`FINALIZE_THREADS` moves run at once. A build killed half-way through
    resumes (every move skips a part that is gone from the state folder).
    """
    shards, moves = [], []
    for part, final in final_names(results, first):
        moves.append((part.name, final))
        index = None
        if part.index is not None:
            index = index_name(final)
            moves.append((part.index, index))
        shards.append(ShardInfo(final, part.num_samples, part.num_bytes, part.sha256, index))
    if state.is_local or len(moves) < 2:
        for name, final in moves:
            _move_if_present(state, name, dest, final)
    else:
        with ThreadPoolExecutor(min(FINALIZE_THREADS, len(moves)), "shardstream-move") as pool:
            for future in [pool.submit(_move_if_present, state, n, dest, f) for n, f in moves]:
                future.result()  # the first error is raised (the others finish first)
    return shards


def _move_if_present(state: Store, name: str, dest: Store, final: str) -> None:
    """Move a part out of the state folder (a resumed build may have moved it already)."""
    if state.exists(name):
        state.move(name, final, into=dest)


def remove_state(state: Store) -> None:
    """Delete the build-state folder and everything in it (its prefix, on object stores)."""
    state.remove_folder()


#: ``progress(items_done, source_bytes_done, total_items, total_bytes)``; totals are ``None``
#: for iterable sources, and while a path source is scanned (then it counts files found).
ProgressCallback = Callable[[int, int, "int | None", "int | None"], None]


def write_chunks(
    table: FileTable,
    chunks: list[np.ndarray],
    dest: Store,
    options: BuildOptions,
    executor: cf.Executor | None,
    progress: ProgressCallback | None,
    first: int = 0,
) -> dict[int, ChunkResult]:
    """Write every planned chunk not already done (by a killed run) into DEST's build state.

    ``first`` numbers the shards the chunks become (an append's follow the dataset's shards).
    """
    state_store = dest.child(STATE_FOLDER)
    shown = dest.shown()
    logger.info("%s: %d files planned into %d chunks", shown, len(table), len(chunks))
    done = load_chunk_records(state_store, len(chunks))
    done = drop_incomplete(dest, state_store, done, len(chunks), first)
    if done:
        logger.info("%s: resuming; %d of %d chunks already written", shown, len(done), len(chunks))
    tasks = (
        ChunkTask(index, state_store, options, table=table.take(indices))
        for index, indices in enumerate(chunks)
        if index not in done
    )
    tracker = Tracker(progress, len(table), table.num_bytes)
    for result in done.values():
        tracker.add(result)
    results = dict(done)
    run_tasks(
        write_chunk, tasks, lambda r: results.__setitem__(r.index, tracker.add(r)),
        options.workers, executor,
    )  # fmt: skip
    return results


class Tracker:
    """Counts finished chunks' items and bytes and reports them to a progress callback."""

    def __init__(
        self, callback: ProgressCallback | None, total: int | None, total_bytes: int | None
    ):
        self._callback, self._total, self._total_bytes = callback, total, total_bytes
        self.items = self.bytes = 0

    def add(self, result: ChunkResult) -> ChunkResult:
        self.items += result.num_items
        self.bytes += result.num_source_bytes
        if self._callback is not None:
            self._callback(self.items, self.bytes, self._total, self._total_bytes)
        return result


#: Path lengths up to this many bytes give member names of at most 100 ASCII bytes, i.e. one
#: plain ustar header block per member ("KEY.json" is at most 5 bytes longer than "KEY").
_SHORT_PATH = 90


def sample_order(num_samples: int, options: BuildOptions) -> np.ndarray:
    """The global sample order: a seeded permutation, or the source order."""
    if not options.shuffle:
        return np.arange(num_samples, dtype=np.int64)
    return np.random.default_rng(options.seed).permutation(num_samples).astype(np.int64)


def sample_tar_sizes(table: FileTable) -> np.ndarray:
    """Tar bytes of each sample as written with pass-through image bytes."""
    padded = -(-table.sizes // BLOCK) * BLOCK
    sizes = BLOCK + padded + np.where(table.labels >= 0, 2 * BLOCK, 0)
    if table.extras is not None:
        extra_lengths = np.diff(table.extras[1])
        sizes += np.where(extra_lengths > 0, BLOCK + -(-extra_lengths // BLOCK) * BLOCK, 0)
    blob, offsets = table.keys if table.keys is not None else (table.paths, table.offsets)
    lengths = np.diff(offsets)
    slow = np.flatnonzero(lengths > _SHORT_PATH) if blob.isascii() else np.arange(len(table))
    for index in slow.tolist():
        sizes[index] = _exact_sample_size(table, index)
    return sizes.astype(np.int64)


def _exact_sample_size(table: FileTable, index: int) -> int:
    from shardstream.shardwriter._tasks import normalized_extension

    key = table.key(index)
    total = member_size(f"{key}.{normalized_extension(table.path(index))}", int(table.sizes[index]))
    label = int(table.labels[index])
    if label >= 0:
        total += member_size(f"{key}.cls", len(str(label)))
    extra = table.extra(index)
    if extra:
        total += member_size(f"{key}.json", len(extra))
    return total


def cut_chunks(
    order: np.ndarray, sizes: np.ndarray, options: BuildOptions, warn_oversize: bool = True
) -> list[np.ndarray]:
    """Cut ``order`` greedily into runs within the sample and byte limits."""
    limit = options.max_bytes_per_shard - END_BYTES
    max_samples = options.max_samples_per_shard or len(order) + 1
    boundaries = [0]
    count = total = 0
    for position, size in enumerate(sizes[order].tolist()):
        if count and (count >= max_samples or total + size > limit):
            boundaries.append(position)
            count = total = 0
        if size > limit and warn_oversize:
            logger.warning(
                "sample %d needs %d bytes, more than max_bytes_per_shard=%d: it gets a shard "
                "of its own",
                int(order[position]),
                size + END_BYTES,
                options.max_bytes_per_shard,
            )
        count += 1
        total += size
    boundaries.append(len(order))
    return [order[start:end] for start, end in itertools.pairwise(boundaries) if end > start]


def plan_chunks(table: FileTable, options: BuildOptions) -> list[np.ndarray]:
    """Chunks of table indices, in output order."""
    order = sample_order(len(table), options)
    return cut_chunks(order, sample_tar_sizes(table), options, warn_oversize=not options.reencodes)
