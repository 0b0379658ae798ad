"""The dataset manifest as a dataclass, and its JSON document (parsed and checked, or written).

No I/O: :mod:`shardstream.format.manifest` reads and writes manifests in a store, chooses the
form to write, and re-exports the names here. The manifest lists every shard with its sample
count, byte size and sha256, so readers can split work exactly and ``shardstream verify`` can
check every byte.

Two forms, both read by this release:

- format 1: the shards are listed in ``manifest.json`` itself (datasets of up to
  ``INLINE_MAX_SHARDS`` shards; older releases read these too);
- format 2: ``manifest.json`` names a binary shard table (``manifest.shards``) written just
  before it, with its size and sha256. A million shards then take about 40 MB instead of
  200 MB of JSON, and open in milliseconds;
- format 3: either form, plus sidecars older releases do not know and must not ignore: the
  samples a version excludes (``excluded``) and fields attached by key (``columns``). A
  manifest without them is still written as format 1 or 2, byte for byte as before.

Readers refuse versions they do not know instead of guessing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from shardstream.errors import ManifestError
from shardstream.format.columns import ColumnSet
from shardstream.format.exclusions import Exclusions, excluded_name
from shardstream.format.manifestfields import (
    check_unique,
    optional_names,
    optional_root,
    optional_view,
    shard_info,
)
from shardstream.format.shardtable import ShardInfo, ShardTable

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Manifest",
    "ShardInfo",
    "SkippedSample",
    "parse_document",
]

FORMAT_NAME = "shardstream-manifest"
FORMAT_VERSION = 2
_READABLE_VERSIONS = (1, 2, 3)
#: The version of a manifest with sidecars older releases must not ignore (either shard form).
SIDECAR_FORMAT = 3


@dataclasses.dataclass(frozen=True)
class SkippedSample:
    """A source item left out of the dataset because of ``on_error="skip"``."""

    source: str
    reason: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    """Everything a reader needs to know about a finished dataset.

    Attributes:
        shards: Every shard, in order (a :class:`ShardTable`; any sequence of
            :class:`ShardInfo` is accepted and converted).
        class_names: Class names in label order (label ``i`` is ``class_names[i]``), or ``None``
            when the source had no class names.
        settings: The build settings used (limits, seed, resize...), for ``inspect`` and resume.
        skipped: Source items skipped under ``on_error="skip"``.
        created_by: The program and version that wrote the dataset.
        shard_root: Where the shards are, when not in the dataset folder (``shardstream index
            SOURCE DEST`` describes shards it cannot write next to): a URL or path, relative
            paths resolved against the dataset folder. Names stay relative to it.
        index_root: Where the shards' indexes are, when not in the dataset folder (a view
            uses its source dataset's).
        view: For a view (a subset of another dataset), the selection that keeps a sample;
            shard counts are the kept samples.
        format_version: The format version it was read from (not compared: the same dataset
            may be written in either form).
        version: The dataset version it describes: 1 for a build, one more for each append; a
            manifest without the field is version 1.
        exclusions: The stored samples this version leaves out (``shardstream exclude``), or
            None; shard counts are then of the kept samples.
        columns: Fields attached to the samples by key (``shardstream attach``), or None.

    Examples:
        >>> m = Manifest(shards=(ShardInfo("shard-000000.tar", 2, 4096, "ab" * 32),))
        >>> Manifest.from_json(m.to_json()).num_samples
        2
    """

    shards: ShardTable
    class_names: tuple[str, ...] | None = None
    settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    skipped: tuple[SkippedSample, ...] = ()
    created_by: str = ""
    shard_root: str | None = None
    index_root: str | None = None
    view: Mapping[str, Any] | None = None
    format_version: int = dataclasses.field(default=FORMAT_VERSION, compare=False)
    version: int = 1
    exclusions: Exclusions | None = None
    columns: ColumnSet | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.shards, ShardTable):
            object.__setattr__(self, "shards", ShardTable.of(self.shards))
        if not isinstance(self.version, int) or isinstance(self.version, bool) or self.version < 1:
            raise ManifestError(f"a dataset version is a positive integer, got {self.version!r}")

    @property
    def num_samples(self) -> int:
        """Total samples over all shards."""
        return self.shards.total_samples

    @property
    def num_bytes(self) -> int:
        """Total bytes over all shards."""
        return self.shards.total_bytes

    def stored_samples(self) -> np.ndarray:
        """Samples each shard file holds: its kept ones plus those this version excludes."""
        counts = self.shards.num_samples
        if self.exclusions is None:
            return counts
        return counts + self.exclusions.counts(len(self.shards))

    def sidecars(self) -> dict[str, bytes]:
        """The files besides the shard table that this manifest names, by name (written
        before it)."""
        if self.exclusions is None:
            return {}
        return {excluded_name(self.version): self.exclusions.encoded}

    def _document(self, version: int) -> dict[str, Any]:
        roots: dict[str, Any] = {
            "shard_root": self.shard_root, "index_root": self.index_root, "view": self.view,
        }  # fmt: skip
        if self.version != 1:  # a build's manifest stays as before versions existed
            roots["version"] = self.version
        if self.exclusions is not None:
            data = self.exclusions.encoded
            roots["excluded"] = {
                "name": excluded_name(self.version), "num_bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(), "num_samples": len(self.exclusions),
            }  # fmt: skip
            version = SIDECAR_FORMAT
        if self.columns is not None:
            roots["columns"], version = self.columns.as_dict(), SIDECAR_FORMAT
        return {
            **{key: value for key, value in roots.items() if value is not None},
            "format": FORMAT_NAME,
            "format_version": version,
            "created_by": self.created_by,
            "num_samples": self.num_samples,
            "num_bytes": self.num_bytes,
            "num_shards": len(self.shards),
            "class_names": list(self.class_names) if self.class_names is not None else None,
            "settings": dict(self.settings),
            "skipped": [dataclasses.asdict(item) for item in self.skipped],
        }

    def to_json(self) -> str:
        """The manifest with every shard inline (format 1), as indented, key-sorted JSON.

        Stable bytes for equal manifests. For millions of shards prefer :meth:`write_json`,
        which streams.
        """
        document = {**self._document(1), "shards": [dataclasses.asdict(s) for s in self.shards]}
        return json.dumps(document, indent=1, sort_keys=True) + "\n"

    def write_json(self, stream: IO[str]) -> None:
        """Write :meth:`to_json`'s document with shards inline, one shard at a time."""
        head = json.dumps({**self._document(1), "shards": []}, indent=1, sort_keys=True)
        before, _, after = head.partition('"shards": []')
        stream.write(before + '"shards": [')
        for number, shard in enumerate(self.shards):
            stream.write(
                ("," if number else "")
                + "\n  "
                + json.dumps(dataclasses.asdict(shard), sort_keys=True)
            )
        stream.write("\n ]" + after + "\n")

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        where: str = "manifest",
        table: ShardTable | None = None,
        exclusions: Exclusions | None = None,
    ) -> Manifest:
        """Parse manifest JSON; ``where`` names the file in errors.

        Args:
            text: The JSON.
            where: Names the file in errors.
            table: The shard table of a format-2 manifest (see :func:`read_manifest`).
            exclusions: The exclusion list a format-3 manifest names (read by
                :func:`read_manifest`).
        """
        document = parse_document(text, where)
        version = document.get("format_version")
        if ("excluded" in document) != (exclusions is not None):
            raise ManifestError(f"{where}: its exclusion list was not read with it")
        try:
            shards = table
            inline = "shard_table" not in document and version == SIDECAR_FORMAT
            if version == 1 or inline:
                shards = ShardTable.of(shard_info(entry, where) for entry in document["shards"])
                check_unique(shards, where)
            elif shards is None:
                raise ManifestError(f"{where}: a format-2 manifest needs its shard table")
            manifest = cls(
                shards=shards,
                class_names=optional_names(document.get("class_names")),
                settings=dict(document.get("settings") or {}),
                skipped=tuple(SkippedSample(**item) for item in document.get("skipped") or ()),
                created_by=str(document.get("created_by", "")),
                shard_root=optional_root(document.get("shard_root"), where),
                index_root=optional_root(document.get("index_root"), where),
                view=optional_view(document.get("view"), where),
                format_version=int(version),  # type: ignore[arg-type]
                version=document.get("version", 1),
                exclusions=exclusions,
                columns=_columns(document.get("columns"), where),
            )
        except (KeyError, TypeError, ValueError) as error:
            if isinstance(error, ManifestError):
                raise
            raise ManifestError(f"{where}: malformed manifest ({error!r})") from error
        for field, value in (
            ("num_samples", manifest.num_samples),
            ("num_shards", len(manifest.shards)),
        ):
            if document.get(field, value) != value:
                raise ManifestError(
                    f"{where}: {field} {document[field]} disagrees with the shard list ({value})"
                )
        return manifest


def _columns(entry: Any, where: str) -> ColumnSet | None:
    return None if entry is None else ColumnSet.from_dict(entry, where)


def parse_document(text: str | bytes, where: str) -> dict[str, Any]:
    """The JSON document of a manifest of a version this release reads; ``where`` names it."""
    try:
        document = json.loads(text)
    except (ValueError, UnicodeDecodeError) as error:
        raise ManifestError(f"{where}: not valid JSON ({error})") from error
    if not isinstance(document, dict) or document.get("format") != FORMAT_NAME:
        raise ManifestError(
            f'{where}: not a shardstream manifest (expected "format": "{FORMAT_NAME}")'
        )
    version = document.get("format_version")
    if version not in _READABLE_VERSIONS:
        raise ManifestError(
            f"{where}: manifest format_version {version!r} is not supported by this release "
            f"(it reads versions {', '.join(map(str, _READABLE_VERSIONS))}); upgrade shardstream"
        )
    return document
