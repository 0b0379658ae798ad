"""What an append must match before it writes anything: the dataset's samples and names.

Each check raises with the first mismatch: the item, what the dataset holds and what the
source would add, and what to do. They run before the append's plan file is written, so a
refused append leaves DEST exactly as it was.
"""

from __future__ import annotations

import itertools
import json
import os

from shardstream.catalog.versions import list_versions, version_name
from shardstream.errors import ConfigError, DatasetExistsError, SourceError
from shardstream.format import codecs
from shardstream.format.manifest import Manifest
from shardstream.format.pixels import PIXELS_EXTENSION
from shardstream.format.samples import iter_samples
from shardstream.format.shardindex import index_name
from shardstream.format.tarreader import open_tar
from shardstream.shardwriter.imageops import normalized_extension
from shardstream.shardwriter.options import BuildOptions
from shardstream.shardwriter.sources import LIST_SUFFIXES, ScannedSource
from shardstream.shardwriter.state import shard_name
from shardstream.storage import Store

__all__ = ["check_appendable", "check_names_free", "check_new_source", "is_empty", "source_history"]


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
