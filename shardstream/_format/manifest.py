"""Checking a manifest's fields one by one: a manifest is data read from storage, too.

Every check raises :class:`~shardstream.errors.ManifestError` naming the manifest and the field,
so a corrupt or hostile manifest is refused before anything reads a shard through it.

The dataset manifest as a dataclass, and its JSON document (parsed and checked, or written).

No I/O: :mod:`shardstream._format.manifest` reads and writes manifests in a store, chooses the
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

The dataset manifest: what a finished build wrote, written last.

A dataset folder (or URL prefix) is valid exactly when it holds ``manifest.json``. This module
reads and writes it in a store: up to ``INLINE_MAX_SHARDS`` shards inline (format 1), more in a
binary shard table written just before it (format 2). The dataclass and its JSON document, with
no I/O, are in :mod:`shardstream._format.manifest`, whose names this module re-exports.

Where a manifest's shards and indexes are (its folder, or the roots it names), and which of
their samples it keeps (a view's selection)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import posixpath
from collections.abc import Mapping, Sequence
from typing import IO, Any

import numpy as np

from shardstream._format.columns import ColumnSet
from shardstream._format.exclusions import Exclusions, Selection, excluded_name
from shardstream._format.shardtable import ShardInfo, ShardTable, decode_table, encode_table
from shardstream._storage import StorageOptions, Store, as_store
from shardstream.errors import ManifestError, ManifestNotFoundError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "INLINE_MAX_SHARDS",
    "MANIFEST_NAME",
    "Manifest",
    "SHARD_TABLE_NAME",
    "ShardInfo",
    "SkippedSample",
    "absolute_root",
    "check_unique",
    "encode_manifest",
    "is_relative_name",
    "optional_names",
    "optional_root",
    "optional_view",
    "parse_document",
    "read_manifest",
    "read_manifest_file",
    "root_store",
    "shard_info",
    "view_selection",
    "write_manifest",
]


def optional_root(root: Any, where: str) -> str | None:
    """A ``shard_root``/``index_root``: absent, or a non-empty URL or path."""
    if root is not None and (not isinstance(root, str) or not root):
        raise ManifestError(f"{where}: a root must be a non-empty URL or path, got {root!r}")
    return root


def optional_view(view: Any, where: str) -> dict[str, Any] | None:
    """A view's description: absent, or an object with a ``select`` object."""
    if view is not None and not (isinstance(view, dict) and isinstance(view.get("select"), dict)):
        raise ManifestError(f"{where}: a view must be an object with a 'select' object")
    return view


def check_unique(shards: ShardTable, where: str) -> None:
    """Refuse a table that lists a shard twice."""
    if shards.names.has_duplicates():
        raise ManifestError(f"{where}: lists a shard twice; the manifest is corrupt")


def optional_names(names: Sequence[str] | None) -> tuple[str, ...] | None:
    """Class names: absent, or a list (of strings)."""
    if names is not None and not isinstance(names, list):
        raise TypeError(f"class_names must be a list or null, not {type(names).__name__}")
    return None if names is None else tuple(str(name) for name in names)


_HEX = frozenset("0123456789abcdef")


def shard_info(entry: Any, where: str) -> ShardInfo:
    """One ``shards`` entry, checked field by field: a manifest is data from storage too."""
    if not isinstance(entry, dict):
        raise TypeError(f"a shard entry must be an object, not {type(entry).__name__}")
    shard = ShardInfo(**entry)
    problem = None
    for field in ("num_samples", "num_bytes"):
        value = getattr(shard, field)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            problem = f"{field} {value!r} is not a non-negative integer"
    digest = shard.sha256
    if digest is not None and (
        not isinstance(digest, str) or len(digest) != 64 or set(digest) - _HEX
    ):
        problem = f"sha256 {digest!r} is not 64 lowercase hex digits (or null)"
    for field in ("name", "index"):
        name = getattr(shard, field)
        if field == "index" and name is None:
            continue
        if not is_relative_name(name):
            problem = f"{field} {name!r} is not a relative file name inside the dataset"
    if problem is not None:
        raise ManifestError(f"{where}: shard entry {entry.get('name')!r}: {problem}")
    return shard


def is_relative_name(name: Any) -> bool:
    """A name that stays inside the dataset folder: relative, no ``..``, no scheme."""
    if not isinstance(name, str) or not name or "\\" in name or "://" in name:
        return False
    return not name.startswith("/") and ".." not in name.split("/")


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


def root_store(dataset: Store, root: str | None) -> Store:
    """The store of a manifest's ``shard_root``/``index_root`` (relative to the dataset).

    Examples:
        >>> root_store(Store("/data/view"), "../train").root
        '/data/train'
    """
    if root is None:
        return dataset
    if "://" not in root and not os.path.isabs(root):
        base = dataset.url()
        scheme, sep, path = base.rpartition("://")
        joined = posixpath.normpath(posixpath.join(path, root))
        root = f"{scheme}{sep}{joined}" if sep else os.path.normpath(os.path.join(base, root))
    return Store(root, dataset.storage_options, dataset.read_options)


def absolute_root(store: Store) -> str:
    """A store's root as another manifest names it (local paths made absolute)."""
    url = store.url()
    return os.path.abspath(url) if store.is_local and "://" not in url else url


def view_selection(dataset: Store, manifest: Manifest) -> Selection | None:
    """The samples a view keeps (None for a dataset that is not a view), its key list read."""
    if manifest.view is None:
        return None
    if manifest.index_root is None and manifest.shard_root is None:
        raise ManifestError(f"{dataset.shown()}: a view must name its source's shards")
    select = dict(manifest.view["select"])
    if select.get("kind") == "where":  # a view by fields keeps samples by its exclusion list
        return None
    keys = None
    if select.get("kind") == "keys":
        data = dataset.read_bytes(str(select.get("file")))
        keys = np.frombuffer(data, dtype="<i8").astype(np.int64)
    return Selection.from_dict(select, keys, dataset.shown())
