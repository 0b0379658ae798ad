"""The dataset manifest: what a finished build wrote, written last.

A dataset folder (or URL prefix) is valid exactly when it holds ``manifest.json``. This module
reads and writes it in a store: up to ``INLINE_MAX_SHARDS`` shards inline (format 1), more in a
binary shard table written just before it (format 2). The dataclass and its JSON document, with
no I/O, are in :mod:`shardstream.format.manifestcodec`, whose names this module re-exports.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from shardstream.errors import ManifestError, ManifestNotFoundError
from shardstream.format.exclusions import Exclusions
from shardstream.format.manifestcodec import (
    FORMAT_NAME,
    FORMAT_VERSION,
    Manifest,
    ShardInfo,
    SkippedSample,
    parse_document,
)
from shardstream.format.manifestfields import check_unique, is_relative_name
from shardstream.format.shardtable import ShardTable
from shardstream.format.tablefile import decode_table, encode_table
from shardstream.storage import StorageOptions, Store, as_store

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INLINE_MAX_SHARDS",
    "MANIFEST_NAME",
    "SHARD_TABLE_NAME",
    "Manifest",
    "ShardInfo",
    "SkippedSample",
    "encode_manifest",
    "read_manifest",
    "read_manifest_file",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
SHARD_TABLE_NAME = "manifest.shards"
#: Above this many shards the shards go to the binary table (format 2).
INLINE_MAX_SHARDS = 10_000
#: A manifest.json is small: shards beyond INLINE_MAX_SHARDS live in the table.
MAX_MANIFEST_BYTES = 256 * 2**20


def read_manifest(
    dataset: Store | str | os.PathLike[str], storage_options: StorageOptions = None
) -> Manifest:
    """Read ``manifest.json`` (and its shard table) from a dataset folder, URL prefix or store.

    A local shard table is memory-mapped, so every process that opens the dataset shares it.
    This is the newest published version of a dataset that grew; the datasets read older
    ones with ``version=N``.

    Raises:
        ManifestNotFoundError: The folder has no manifest (an unfinished build, or a wrong path).
        ManifestError: The manifest or its table is malformed, of an unsupported version, or
            implausibly large.

    Examples:
        >>> manifest = read_manifest("s3://bucket/train")  # doctest: +SKIP
    """
    return read_manifest_file(as_store(dataset, storage_options), MANIFEST_NAME)


def read_manifest_file(store: Store, name: str) -> Manifest:
    """Read the manifest file ``name`` of ``store`` (and the shard table it names)."""
    where = store.shown(name)
    try:
        with store.open_read(name) as stream:
            text = stream.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError as error:
        if store.is_local and not os.path.exists(store.local_path("")):
            raise ManifestNotFoundError(
                f"{store.shown()}: does not exist; check the path (a dataset folder holds "
                f"{MANIFEST_NAME})"
            ) from error
        raise ManifestNotFoundError(
            f"{where}: no manifest. A shardstream dataset is complete only once its manifest is "
            "written last; run `shardstream build` again with the same arguments to finish an "
            "interrupted build, `shardstream index` to describe shards made by other tools, or "
            "pass shard URLs (a brace pattern) to read shards without one."
        ) from error
    if len(text) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{where}: larger than {MAX_MANIFEST_BYTES} bytes; not a manifest")
    document = parse_document(text, where)
    table = None
    if document.get("format_version") == 2 or "shard_table" in document:
        table = _read_table(store, document.get("shard_table"), where)
    exclusions = None
    if "excluded" in document:
        num_shards = document.get("num_shards")
        exclusions = _read_exclusions(store, document["excluded"], where, num_shards)
    return Manifest.from_json(text, where=where, table=table, exclusions=exclusions)


def _read_exclusions(store: Store, entry: Any, where: str, num_shards: Any) -> Exclusions:
    if not isinstance(entry, dict) or not is_relative_name(entry.get("name")):
        raise ManifestError(f"{where}: excluded must name a file inside the dataset")
    name = entry["name"]
    try:
        data = store.read_mapped(name)
    except FileNotFoundError as error:
        raise ManifestError(
            f"{store.shown(name)}: missing; the manifest lists the samples it excludes there. "
            "Copy the whole dataset folder."
        ) from error
    if len(data) != entry.get("num_bytes"):
        raise ManifestError(
            f"{store.shown(name)}: {len(data)} bytes, the manifest says {entry.get('num_bytes')}"
            "; the list belongs to another version or was cut short"
        )
    exclusions = Exclusions.decode(data, store.shown(name), int(num_shards or 0))
    if len(exclusions) != entry.get("num_samples"):
        raise ManifestError(f"{store.shown(name)}: does not hold the manifest's count")
    return exclusions


def _read_table(store: Store, entry: Any, where: str) -> ShardTable:
    if not isinstance(entry, dict) or not is_relative_name(entry.get("name")):
        raise ManifestError(f"{where}: shard_table must name a file inside the dataset")
    name = entry["name"]
    try:
        data = store.read_mapped(name)
    except FileNotFoundError as error:
        raise ManifestError(
            f"{store.shown(name)}: missing; the manifest lists its shards there. Copy the whole "
            "dataset folder, or rebuild it."
        ) from error
    if len(data) != entry.get("num_bytes"):
        raise ManifestError(
            f"{store.shown(name)}: {len(data)} bytes, the manifest says {entry.get('num_bytes')}; "
            "the table belongs to another build or was cut short"
        )
    return decode_table(data, store.shown(name))


def write_manifest(
    dataset: Store | str | os.PathLike[str],
    manifest: Manifest,
    storage_options: StorageOptions = None,
) -> str:
    """Atomically write ``manifest.json`` (after its shard table, if any); return its URL.

    Up to :data:`INLINE_MAX_SHARDS` shards are written inline (format 1); more go to
    ``manifest.shards`` first (format 2).
    """
    store = as_store(dataset, storage_options)
    text, table = encode_manifest(manifest, SHARD_TABLE_NAME, store.shown(MANIFEST_NAME))
    if table is not None:
        with store.open_atomic_write(SHARD_TABLE_NAME) as stream:
            stream.write(table)
    for name, data in manifest.sidecars().items():
        with store.open_atomic_write(name) as stream:
            stream.write(data)
    with store.open_atomic_write(MANIFEST_NAME) as stream:
        stream.write(text)
    return store.url(MANIFEST_NAME)


def encode_manifest(manifest: Manifest, table_name: str, where: str) -> tuple[bytes, bytes | None]:
    """The manifest's JSON bytes, and its binary shard table (format 2) or None (format 1).

    Args:
        manifest: The manifest.
        table_name: The name the JSON gives the table, when there is one.
        where: Names the manifest in errors.
    """
    if len(manifest.shards) <= INLINE_MAX_SHARDS:
        return manifest.to_json().encode("utf-8"), None
    check_unique(manifest.shards, where)
    table = encode_table(manifest.shards)
    reference = {
        "name": table_name,
        "num_bytes": len(table),
        "sha256": hashlib.sha256(table).hexdigest(),
    }
    document = {**manifest._document(2), "shard_table": reference}  # 3 with sidecars
    return (json.dumps(document, indent=1, sort_keys=True) + "\n").encode("utf-8"), table
