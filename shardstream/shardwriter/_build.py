"""``build_shards``: scan, plan, write chunks in parallel, rename in order, manifest last.

One partition of a build spread over an existing engine: :func:`write_partition`.

Each task writes its samples as a complete small dataset in ``DEST/part-NNNNN``; when all are
done, :func:`~shardstream.merge_partitions` writes the dataset's manifest over them."""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from shardstream._catalog.execute import partition_folder, run_tasks
from shardstream._format.inspection import write_timm_info
from shardstream._format.manifest import MANIFEST_NAME, Manifest, write_manifest
from shardstream._format.shardtable import ShardTable
from shardstream._storage import Store
from shardstream._storage.store import destination_lock
from shardstream._version import __version__
from shardstream.errors import ConfigError, DatasetExistsError, SourceError
from shardstream.shardwriter import _state as state
from shardstream.shardwriter._sources import (
    ScannedSource,
    chunk_samples,
    refuse_destination_inside,
    scan_source,
)
from shardstream.shardwriter._state import ProgressCallback, Tracker, plan_chunks, write_chunks
from shardstream.shardwriter._tasks import BuildOptions, ChunkResult, ChunkTask, write_chunk

__all__ = [
    "ProgressCallback",
    "build_shards",
    "write_partition",
]


logger = logging.getLogger(__name__)

Source = str | os.PathLike[str] | Iterable[Mapping[str, Any]]


def build_shards(
    source: Source,
    dest: str | os.PathLike[str],
    options: BuildOptions | None = None,
    *,
    executor: cf.Executor | None = None,
    storage_options: Mapping[str, Any] | None = None,
    progress: ProgressCallback | None = None,
    **overrides: Any,
) -> Manifest:
    """Pack a source into WebDataset tar shards plus ``manifest.json`` (written last).

    Args:
        source: An ImageFolder directory, a ``.csv``/``.jsonl`` list of ``path,label[,...]``,
            or an iterable of sample dicts ``{"__key__": "a/1", "jpg": b"...", "cls": 3}``
            (written in the given order: iterables are not shuffled).
        dest: A local folder or fsspec URL; it must be new, empty, or hold this same build
            (with ``append=True``: a dataset, which the samples are added to as a new version).
        options: Shard limits, shuffle, re-encoding, error policy; see :class:`BuildOptions`.
        executor: Runs chunk tasks, e.g. ``distributed.Client(...).get_executor()``. By
            default ``options.workers`` local processes (or this process when 1). The output
            is byte-identical whichever runs it; ``options.workers`` bounds tasks in flight.
        storage_options: Passed to fsspec for ``dest``.
        progress: Called after each chunk with cumulative items/bytes and totals; while a
            path source is scanned, every few hundred files with the files and bytes found
            so far and totals of None.
        **overrides: Any :class:`BuildOptions` field, e.g. ``max_samples_per_shard=1000``.

    Returns:
        The manifest of the finished dataset.

    Raises:
        SourceError: An unreadable file or an image that fails the signature/end-marker
            check (``on_error="raise"``), a bad or empty source.
        DuplicateKeyError: Two samples share a key.
        DatasetExistsError: DEST holds something else and ``overwrite`` is false; with
            ``append``, another append into DEST won the race.

    Examples:
        >>> manifest = build_shards("data/train", "shards/train", max_samples_per_shard=5000,
        ...                         workers=4)  # doctest: +SKIP
        >>> manifest.num_samples, len(manifest.shards)  # doctest: +SKIP
        (1281167, 257)
        >>> build_shards("crawl/2026-11-25", "shards/train", append=True)  # doctest: +SKIP
    """
    options = _resolve_options(options, overrides)
    store = Store(dest, storage_options)
    if isinstance(source, (bytes, Mapping)):
        raise ConfigError("source must be a path, a URL-free list file, or an iterable of dicts")
    if isinstance(source, (str, os.PathLike)):
        refuse_destination_inside(source, store)
    if options.append:
        from shardstream.shardwriter._append import append_source

        return append_source(source, store, options, executor, progress)
    if isinstance(source, (str, os.PathLike)):
        # A bad source leaves DEST untouched.
        scanned = scan_source(source, options.on_error, progress)
        with destination_lock(store):
            return _build_from_table(scanned, os.fspath(source), store, options, executor, progress)
    with destination_lock(store):
        return _build_from_iterable(source, store, options, executor, progress)


def _resolve_options(options: BuildOptions | None, overrides: dict[str, Any]) -> BuildOptions:
    options = options or BuildOptions()
    names = {field.name for field in dataclasses.fields(BuildOptions)}
    unknown = sorted(set(overrides) - names)
    if unknown:
        raise ConfigError(f"unknown build options {unknown}; valid: {sorted(names)}")
    return dataclasses.replace(options, **overrides)


def _build_from_table(
    scanned: ScannedSource,
    source_path: str,
    dest: Store,
    options: BuildOptions,
    executor: cf.Executor | None,
    progress: ProgressCallback | None,
) -> Manifest:
    table = scanned.table
    settings = {
        **options.output_settings(),
        "source_kind": scanned.kind,
        "source_path": os.path.abspath(source_path),
        "source_fingerprint": table.fingerprint(),
        "source_items": len(table) + len(scanned.skipped),
    }
    existing = state.prepare_destination(dest, settings, options.overwrite)
    if existing is not None:
        return existing
    state_store = dest.child(state.STATE_FOLDER)
    chunks = plan_chunks(table, options)
    results = write_chunks(table, chunks, dest, options, executor, progress)
    return _finish(dest, state_store, results, scanned.class_names, settings, scanned)


def _build_from_iterable(
    samples: Iterable[Mapping[str, Any]],
    dest: Store,
    options: BuildOptions,
    executor: cf.Executor | None,
    progress: ProgressCallback | None,
) -> Manifest:
    if options.pixels is not None:
        raise ConfigError(
            "pixels decodes image files of a folder or list source; an iterable's samples are "
            "written as given: pass a numpy uint8 (height, width, 3) array as its "
            "'pixels.npy' member instead"
        )
    settings = {**options.output_settings(), "shuffle": False, "source_kind": "iterable"}
    if dest.exists(MANIFEST_NAME) and not options.overwrite:
        raise DatasetExistsError(
            f"{dest.shown()}: already holds a dataset, and an iterable source cannot be compared "
            "with it without consuming it. Choose another destination or pass overwrite=True."
        )
    # An iterable cannot be compared with a finished dataset: overwrite always starts over.
    state.prepare_destination(dest, settings, options.overwrite, reuse_finished=False)
    state_store = dest.child(state.STATE_FOLDER)
    done = state.load_chunk_records(state_store, 2**62)
    tracker = Tracker(progress, None, None)
    results: dict[int, ChunkResult] = {}

    def tasks() -> Iterator[ChunkTask]:
        for index, (chunk, digest) in enumerate(chunk_samples(samples, options)):
            previous = done.get(index)
            if (
                previous is not None
                and previous.digest == digest
                and _parts_exist(state_store, previous)
            ):
                results[index] = tracker.add(previous)
                continue
            yield ChunkTask(index, state_store, options, samples=chunk, digest=digest)

    run_tasks(
        write_chunk, tasks(), lambda r: results.__setitem__(r.index, tracker.add(r)),
        options.workers, executor,
    )  # fmt: skip
    if not results:
        raise SourceError("the iterable source yielded no samples")
    return _finish(dest, state_store, results, None, settings, None)


def _parts_exist(state_store: Store, result: ChunkResult) -> bool:
    names = [n for part in result.shards for n in (part.name, part.index) if n is not None]
    return all(state_store.exists(name) for name in names)


def _finish(
    dest: Store,
    state_store: Store,
    results: dict[int, ChunkResult],
    class_names: tuple[str, ...] | None,
    settings: dict,
    scanned: ScannedSource | None,
) -> Manifest:
    ordered = [results[index] for index in sorted(results)]
    shards = state.finalize_shards(dest, state_store, ordered)
    skipped = (scanned.skipped if scanned else ()) + tuple(
        item for result in ordered for item in result.skipped
    )
    if skipped:
        logger.warning(
            "%s: skipped %d unusable items (listed in the manifest)", dest.shown(), len(skipped)
        )
    manifest = Manifest(
        shards=ShardTable.of(shards),
        class_names=class_names,
        settings=settings,
        skipped=skipped,
        created_by=f"shardstream {__version__}",
    )
    # timm's WebDataset reader needs _info.json; like the shards, it precedes the manifest.
    write_timm_info(dest, manifest)
    write_manifest(dest, manifest)
    state.remove_state(state_store)
    logger.info("%s: %d samples in %d shards", dest.shown(), manifest.num_samples, len(shards))
    return manifest


def write_partition(
    samples: Iterable[Mapping[str, Any]],
    dest: str | os.PathLike[str],
    partition: int,
    options: BuildOptions | None = None,
    *,
    storage_options: Mapping[str, Any] | None = None,
    **overrides: Any,
) -> Manifest:
    """Write one partition's samples as shards into ``dest/part-NNNNN`` (replacing a retry's).

    Args:
        samples: Sample dicts as :func:`~shardstream.build_shards` takes them
            (``{"__key__": ..., "jpg": bytes, "cls": 3}``), in the order to write them.
        dest: The dataset folder or URL shared by all partitions.
        partition: This task's partition number (Spark's partition id, Ray's batch or block
            number, ``SLURM_ARRAY_TASK_ID``): the same number on a retry.
        options: Shard limits and encoding, as for ``build_shards`` (``overwrite`` is implied).
        storage_options: fsspec options for ``dest``.
        **overrides: Any :class:`BuildOptions` field.

    Returns:
        The partition's own manifest.

    Examples:
        >>> def task(rows, partition):  # doctest: +SKIP
        ...     samples = ({"__key__": r["id"], "jpg": r["image"], "cls": r["label"]} for r in rows)
        ...     write_partition(samples, "s3://bucket/train", partition, workers=1)
    """
    options = options or BuildOptions()
    merged = {"workers": 1, **overrides, "overwrite": True}
    folder = Store(dest, storage_options).url(partition_folder(partition))
    return build_shards(samples, folder, options, storage_options=storage_options, **merged)
