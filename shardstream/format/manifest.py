"""The dataset manifest: what a finished build wrote, written last.

A dataset folder (or URL prefix) is valid exactly when it holds ``manifest.json``. The manifest
lists every shard with its sample count, byte size and sha256, so readers can split work exactly
and ``shardstream verify`` can check every byte. The JSON carries a ``format_version``; readers
refuse versions they do not know instead of guessing.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from shardstream.errors import ManifestError, ManifestNotFoundError
from shardstream.storage import StorageOptions, Store, as_store

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "Manifest",
    "ShardInfo",
    "SkippedSample",
    "read_manifest",
    "write_manifest",
]

MANIFEST_NAME = "manifest.json"
#: A manifest lists shards, not samples: 256 MiB would describe millions of shards.
MAX_MANIFEST_BYTES = 256 * 2**20
FORMAT_NAME = "shardstream-manifest"
FORMAT_VERSION = 1


@dataclasses.dataclass(frozen=True)
class ShardInfo:
    """One shard of a dataset.

    Attributes:
        name: File name relative to the dataset folder, e.g. ``"shard-000000.tar"``.
        num_samples: Samples (distinct keys) in the shard.
        num_bytes: Size of the shard file in bytes.
        sha256: Hex sha256 of the shard file's bytes.
        index: Name of the shard's byte-offset index (``"shard-000000.idx"``, see
            :mod:`shardstream.format.shardindex`), or ``None`` when the shard has none (older
            builds).
    """

    name: str
    num_samples: int
    num_bytes: int
    sha256: str
    index: str | None = None


@dataclasses.dataclass(frozen=True)
class SkippedSample:
    """A source item left out of the dataset because of ``on_error="skip"``."""

    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to know about a finished dataset.

    Attributes:
        shards: Every shard, in order.
        class_names: Class names in label order (label ``i`` is ``class_names[i]``), or ``None``
            when the source had no class names.
        settings: The build settings used (limits, seed, resize...), for ``inspect`` and resume.
        skipped: Source items skipped under ``on_error="skip"``.
        created_by: The program and version that wrote the dataset.
        format_version: Manifest format version.

    Example:
        >>> m = Manifest(shards=(ShardInfo("shard-000000.tar", 2, 4096, "ab" * 32),))
        >>> Manifest.from_json(m.to_json()).num_samples
        2
    """

    shards: tuple[ShardInfo, ...]
    class_names: tuple[str, ...] | None = None
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    skipped: tuple[SkippedSample, ...] = ()
    created_by: str = ""
    format_version: int = FORMAT_VERSION

    @property
    def num_samples(self) -> int:
        """Total samples over all shards."""
        return sum(shard.num_samples for shard in self.shards)

    @property
    def num_bytes(self) -> int:
        """Total bytes over all shards."""
        return sum(shard.num_bytes for shard in self.shards)

    def to_json(self) -> str:
        """Serialize to indented, key-sorted JSON (stable bytes for equal manifests)."""
        document = {
            "format": FORMAT_NAME,
            "format_version": self.format_version,
            "created_by": self.created_by,
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "class_names": list(self.class_names) if self.class_names is not None else None,
            "settings": dict(self.settings),
            "shards": [dataclasses.asdict(shard) for shard in self.shards],
            "skipped": [dataclasses.asdict(item) for item in self.skipped],
        }
        return json.dumps(document, indent=1, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str | bytes, where: str = "manifest") -> Manifest:
        """Parse manifest JSON; ``where`` names the file in error messages."""
        try:
            document = json.loads(text)
        except (ValueError, UnicodeDecodeError) as error:
            raise ManifestError(f"{where}: not valid JSON ({error})") from error
        if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
            raise ManifestError(
                f'{where}: not a shardstream manifest (expected "format": "{FORMAT_NAME}")'
            )
        version = document.get("format_version")
        if version != FORMAT_VERSION:
            raise ManifestError(
                f"{where}: manifest format_version {version!r} is not supported by this release "
                f"(it reads version {FORMAT_VERSION}); upgrade shardstream"
            )
        try:
            manifest = cls(
                shards=tuple(_shard_info(shard, where) for shard in document["shards"]),
                class_names=_optional_names(document.get("class_names")),
                settings=dict(document.get("settings") or {}),
                skipped=tuple(SkippedSample(**item) for item in document.get("skipped") or ()),
                created_by=str(document.get("created_by", "")),
                format_version=version,
            )
        except (KeyError, TypeError, ValueError) as error:
            if isinstance(error, ManifestError):
                raise
            raise ManifestError(f"{where}: malformed manifest ({error!r})") from error
        names = [shard.name for shard in manifest.shards]
        if len(set(names)) != len(names):
            raise ManifestError(f"{where}: lists a shard twice; the manifest is corrupt")
        if document.get("num_samples", manifest.num_samples) != manifest.num_samples:
            raise ManifestError(
                f"{where}: num_samples {document['num_samples']} disagrees with the sum of the "
                f"shard counts ({manifest.num_samples})"
            )
        return manifest


def _optional_names(names: Sequence[str] | None) -> tuple[str, ...] | None:
    if names is not None and not isinstance(names, list):
        raise TypeError(f"class_names must be a list or null, not {type(names).__name__}")
    return None if names is None else tuple(str(name) for name in names)


_HEX = frozenset("0123456789abcdef")


def _shard_info(entry: Any, where: str) -> ShardInfo:
    """One ``shards`` entry, checked field by field: a manifest is data from storage too."""
    if not isinstance(entry, dict):
        raise TypeError(f"a shard entry must be an object, not {type(entry).__name__}")
    shard = ShardInfo(**entry)
    problem = None
    for field in ("num_samples", "num_bytes"):
        value = getattr(shard, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problem = f"{field} {value!r} is not a non-negative integer"
    if not isinstance(shard.sha256, str) or len(shard.sha256) != 64 or set(shard.sha256) - _HEX:
        problem = f"sha256 {shard.sha256!r} is not 64 lowercase hex digits"
    for field in ("name", "index"):
        name = getattr(shard, field)
        if field == "index" and name is None:
            continue
        if not _is_relative_name(name):
            problem = f"{field} {name!r} is not a relative file name inside the dataset"
    if problem is not None:
        raise ManifestError(f"{where}: shard entry {entry.get('name')!r}: {problem}")
    return shard


def _is_relative_name(name: Any) -> bool:
    """A name that stays inside the dataset folder: relative, no ``..``, no scheme."""
    if not isinstance(name, str) or not name or "\\" in name or "://" in name:
        return False
    return not name.startswith("/") and ".." not in name.split("/")


def read_manifest(
    dataset: Store | str | os.PathLike[str], storage_options: StorageOptions = None
) -> Manifest:
    """Read ``manifest.json`` from a dataset folder, URL prefix or :class:`Store`.

    Raises:
        ManifestNotFoundError: The folder has no manifest (an unfinished build, or a wrong path).
        ManifestError: The manifest is malformed, of an unsupported version, or implausibly large.

    Example:
        >>> manifest = read_manifest("s3://bucket/train")  # doctest: +SKIP
    """
    store = as_store(dataset, storage_options)
    try:
        with store.open_read(MANIFEST_NAME) as stream:
            text = stream.read(MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError as error:
        raise ManifestNotFoundError(
            f"{store.shown(MANIFEST_NAME)}: no manifest. A shardstream dataset is complete only "
            "once its manifest is written last; run `shardstream build` again with the same "
            "arguments to finish an interrupted build, or pass shard URLs (a brace pattern) to "
            "read shards without one."
        ) from error
    if len(text) > MAX_MANIFEST_BYTES:
        raise ManifestError(
            f"{store.shown(MANIFEST_NAME)}: larger than {MAX_MANIFEST_BYTES} bytes; not a manifest"
        )
    return Manifest.from_json(text, where=store.shown(MANIFEST_NAME))


def write_manifest(
    dataset: Store | str | os.PathLike[str],
    manifest: Manifest,
    storage_options: StorageOptions = None,
) -> str:
    """Atomically write ``manifest.json`` into a dataset folder, URL or store; return its URL."""
    store = as_store(dataset, storage_options)
    with store.open_atomic_write(MANIFEST_NAME) as stream:
        stream.write(manifest.to_json().encode("utf-8"))
    return store.url(MANIFEST_NAME)
