"""Build state in DEST: what makes a killed build resumable and a finished one idempotent.

Layout while a build runs::

    DEST/_shardstream_build/plan.json              settings + source fingerprint
    DEST/_shardstream_build/chunk-000012-000.tar    a chunk's shard, under its part name
    DEST/_shardstream_build/chunk-000012-000.idx    its byte-offset index, written after it
    DEST/_shardstream_build/chunk-000012.json       written after the chunk's parts: it is done

When every chunk is done, parts (and their indexes) are renamed in plan order to
``DEST/shard-000000.tar`` (``.idx``)..., the manifest is written last, and the state folder is
removed. Temporary names never match ``shard-*``, and a part counts only when its chunk record
exists, its size matches and its index exists. A re-run also removes what a build killed in its
last steps leaves behind: a temporary of ``manifest.json`` in DEST, and the state folder once
the manifest is there.
"""

from __future__ import annotations

import fnmatch
import json
import logging

from shardstream import _fs
from shardstream.errors import DatasetExistsError, ManifestError
from shardstream.manifest import MANIFEST_NAME, Manifest, ShardInfo, read_manifest
from shardstream.shardindex import index_name
from shardstream.shardwriter.tasks import ChunkResult

__all__ = [
    "STATE_FOLDER",
    "finalize_shards",
    "load_chunk_records",
    "prepare_destination",
    "remove_state",
    "shard_name",
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
        name == MANIFEST_NAME
        or fnmatch.fnmatch(name, SHARD_PATTERN)
        or fnmatch.fnmatch(name, INDEX_PATTERN)
    )


def _comparable(settings: dict) -> dict:
    return {k: v for k, v in settings.items() if k not in _IGNORED_SETTINGS}


def prepare_destination(
    dest: str, settings: dict, overwrite: bool, storage_options: _fs.StorageOptions = None
) -> Manifest | None:
    """Check DEST and start or resume a build; return the finished manifest if already built.

    Raises:
        DatasetExistsError: DEST holds another dataset, another unfinished build, or unrelated
            files, and ``overwrite`` is false.
    """
    state_url = _fs.join(dest, STATE_FOLDER)
    names = _fs.list_names(dest, storage_options)
    if MANIFEST_NAME in names:
        manifest = _read_existing(dest, storage_options)
        if manifest is not None and _comparable(dict(manifest.settings)) == _comparable(settings):
            logger.info("%s: already built with these settings; nothing to do", dest)
            # A build killed between its manifest and the state's removal left the state.
            _remove_temporaries(dest, names, storage_options)
            remove_state(state_url, storage_options)
            return manifest
        if not overwrite:
            raise DatasetExistsError(
                f"{dest}: already holds a dataset ({_describe(manifest)}) built with other "
                f"settings or another source (differences: {_differences(manifest, settings)}). "
                "Choose another destination, or pass overwrite=True (--overwrite) to replace it."
            )
    plan = _read_plan(state_url, storage_options)
    if plan is not None and _comparable(plan) != _comparable(settings) and not overwrite:
        raise DatasetExistsError(
            f"{dest}: holds an unfinished build with other settings or another source "
            f"(differences: {_differences_plain(plan, settings)}). Re-run with the same "
            "arguments to finish it, or pass overwrite=True (--overwrite) to start over."
        )
    _check_foreign_files(dest, names, resuming=plan is not None, overwrite=overwrite)
    if overwrite:
        _clear(dest, names, state_url, storage_options)
        plan = None
    else:
        _remove_temporaries(dest, names, storage_options)
    if plan is None:
        _fs.makedirs(state_url, storage_options)
        with _fs.open_atomic_write(_fs.join(state_url, PLAN_NAME), storage_options) as stream:
            stream.write(json.dumps(settings, sort_keys=True).encode("utf-8"))
    return None


def _read_existing(dest: str, storage_options: _fs.StorageOptions) -> Manifest | None:
    try:
        return read_manifest(dest, storage_options)
    except ManifestError:
        return None


def _describe(manifest: Manifest | None) -> str:
    if manifest is None:
        return "an unreadable manifest.json"
    return f"{manifest.num_samples} samples in {len(manifest.shards)} shards"


def _differences(manifest: Manifest | None, settings: dict) -> str:
    return "unknown" if manifest is None else _differences_plain(dict(manifest.settings), settings)


def _differences_plain(found: dict, expected: dict) -> str:
    keys = sorted(
        k
        for k in set(found) | set(expected) - _IGNORED_SETTINGS
        if found.get(k) != expected.get(k) and k not in _IGNORED_SETTINGS
    )
    return ", ".join(f"{k}: found {found.get(k)!r}, asked {expected.get(k)!r}" for k in keys)


def _read_plan(state_url: str, storage_options: _fs.StorageOptions) -> dict | None:
    url = _fs.join(state_url, PLAN_NAME)
    try:
        return dict(json.loads(_fs.read_bytes(url, storage_options)))
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


def _clear(
    dest: str, names: list[str], state_url: str, storage_options: _fs.StorageOptions
) -> None:
    for name in names:
        if _is_ours(name) or ".tmp-" in name:
            _fs.remove(_fs.join(dest, name), storage_options)
    remove_state(state_url, storage_options)


def _remove_temporaries(dest: str, names: list[str], storage_options: _fs.StorageOptions) -> None:
    """Delete the temporaries of a killed build's unfinished atomic writes (its manifest)."""
    for name in names:
        if ".tmp-" in name:
            _fs.remove(_fs.join(dest, name), storage_options)


def load_chunk_records(
    state_url: str, num_chunks: int, storage_options: _fs.StorageOptions = None
) -> dict[int, ChunkResult]:
    """Chunk records of a resumed build whose parts are all present; removes stale temps."""
    records: dict[int, ChunkResult] = {}
    names = set(_fs.list_names(state_url, storage_options))
    for name in sorted(names):
        if ".tmp-" in name:
            _fs.remove(_fs.join(state_url, name), storage_options)
        elif name.startswith("chunk-") and name.endswith(".json"):
            text = _fs.read_bytes(_fs.join(state_url, name), storage_options)
            record = ChunkResult.from_json(text)
            if record.index < num_chunks:
                records[record.index] = record
    return records


def _part_present(
    dest: str, state_url: str, part: ShardInfo, final: str, storage_options: _fs.StorageOptions
) -> bool:
    if part.index is not None and not any(
        _fs.exists(url, storage_options)
        for url in (_fs.join(state_url, part.index), _fs.join(dest, index_name(final)))
    ):
        return False
    for url in (_fs.join(state_url, part.name), _fs.join(dest, final)):
        if _fs.exists(url, storage_options) and _fs.size(url, storage_options) == part.num_bytes:
            return True
    return False


def final_names(results: list[ChunkResult]) -> list[tuple[ShardInfo, str]]:
    """Each part with its final shard name, numbered in plan order."""
    parts = [shard for result in sorted(results, key=lambda r: r.index) for shard in result.shards]
    return [(part, shard_name(index)) for index, part in enumerate(parts)]


def drop_incomplete(
    dest: str,
    state_url: str,
    records: dict[int, ChunkResult],
    num_chunks: int,
    storage_options: _fs.StorageOptions = None,
) -> dict[int, ChunkResult]:
    """Keep only records whose parts all exist with the recorded size (in state or renamed)."""
    if len(records) == num_chunks:
        names = final_names(list(records.values()))
        bad = {
            index
            for index, result in records.items()
            for part, final in names
            if part in result.shards
            and not _part_present(dest, state_url, part, final, storage_options)
        }
        return {i: r for i, r in records.items() if i not in bad}
    return {
        index: result
        for index, result in records.items()
        if all(_part_in_state(state_url, part, storage_options) for part in result.shards)
    }


def _part_in_state(state_url: str, part: ShardInfo, storage_options: _fs.StorageOptions) -> bool:
    url = _fs.join(state_url, part.name)
    if not (_fs.exists(url, storage_options) and _fs.size(url, storage_options) == part.num_bytes):
        return False
    return part.index is None or _fs.exists(_fs.join(state_url, part.index), storage_options)


def finalize_shards(
    dest: str, state_url: str, results: list[ChunkResult], storage_options: _fs.StorageOptions
) -> list[ShardInfo]:
    """Rename every part to its final shard name in plan order; return the final ShardInfos."""
    shards = []
    for part, final in final_names(results):
        source = _fs.join(state_url, part.name)
        if _fs.exists(source, storage_options):
            # Server-side on object stores: a rename locally, CopyObject + delete on S3.
            _fs.move(source, _fs.join(dest, final), storage_options)
        index = None
        if part.index is not None:
            index = index_name(final)
            index_source = _fs.join(state_url, part.index)
            if _fs.exists(index_source, storage_options):
                _fs.move(index_source, _fs.join(dest, index), storage_options)
        shards.append(ShardInfo(final, part.num_samples, part.num_bytes, part.sha256, index))
    return shards


def remove_state(state_url: str, storage_options: _fs.StorageOptions = None) -> None:
    """Delete the build-state folder and everything in it (its prefix, on object stores)."""
    _fs.remove_folder(state_url, storage_options)
