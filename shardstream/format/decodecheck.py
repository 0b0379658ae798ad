"""``verify --decode``: decode every image member of a dataset with Pillow, as training does.

``build`` checks images cheaply (signature and end marker, or the header: see
:mod:`shardstream.shardwriter.imageops`), so damage inside a JPEG's compressed data, with its
markers intact, passes it and ``verify`` (which checks bytes against the manifest). This check
decodes each image fully; Pillow's verdict is the one the CPU decode path gives in training.
It costs a full decode of every image (see the CHANGELOG for a measurement). Pixel members
(``build --pixels``) are checked as readers read them: header and size.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Callable

import numpy as np
from PIL import Image, UnidentifiedImageError

from shardstream.errors import DecodeError
from shardstream.format.keys import key_hash
from shardstream.format.manifest import Manifest
from shardstream.format.pixels import is_pixels, pixel_array
from shardstream.format.roots import root_store, view_selection
from shardstream.format.samples import iter_samples
from shardstream.format.tarreader import open_tar
from shardstream.storage import Store

__all__ = ["IMAGE_EXTENSIONS", "find_undecodable"]

#: Members decoded as images (what the streaming decoders take for images).
IMAGE_EXTENSIONS = frozenset({"jpg", "jpeg", "png", "webp", "bmp", "gif", "tif", "tiff", "ppm"})
_FAILURES = (OSError, ValueError, SyntaxError, UnidentifiedImageError, Image.DecompressionBombError)


def find_undecodable(
    store: Store, manifest: Manifest, progress: Callable[[int], None] | None = None
) -> list[str]:
    """One line per image member of the dataset's samples that Pillow cannot decode.

    Samples the version excludes, or a view leaves out, are not decoded.

    Examples:
        >>> find_undecodable(Store("shards/train"), read_manifest("shards/train"))  # doctest: +SKIP
        ["shard-000003.tar: key 'n01440764_10026' member 'jpg' does not decode (...)"]
    """
    shards, selection = root_store(store, manifest.shard_root), view_selection(store, manifest)
    found: list[str] = []
    for number, info in enumerate(manifest.shards):
        excluded: set[int] = set()
        if manifest.exclusions is not None:
            excluded = {int(position) for position in manifest.exclusions.positions(number)}
        with shards.open_read(info.name) as stream:
            samples = iter_samples(open_tar(stream, shards.shown(info.name)))
            for position, (sample, _) in enumerate(samples):
                key = str(sample["__key__"])
                if position in excluded or (
                    selection is not None
                    and not selection.keep(np.array([key_hash(key)], np.int64))[0]
                ):
                    continue
                found += _undecodable(sample, f"{info.name}: key {key!r}")
        if progress is not None:
            progress(number + 1)
    return found


def _undecodable(sample: dict, where: str) -> list[str]:
    found = []
    for name, data in sample.items():
        if is_pixels(name):  # stored decoded (build --pixels): its header and size must agree
            try:
                pixel_array(data, "")
            except DecodeError as error:
                found.append(f"{where} member {name!r} does not decode ({error})")
            continue
        if name.startswith("__") or name.rpartition(".")[2].lower() not in IMAGE_EXTENSIONS:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # a decompression bomb warning is not damage
                with Image.open(io.BytesIO(data)) as image:
                    image.load()
        except _FAILURES as error:
            found.append(f"{where} member {name!r} does not decode ({error})")
    return found
