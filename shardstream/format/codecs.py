"""Member encoding and decoding by file extension, shared by the writer and the reader.

A WebDataset sample is a group of tar members ``KEY.EXT``; the extension says how the bytes are
encoded. This module turns Python values into member bytes (writer) and member bytes back into
values (reader) for the common extensions. Images are not decoded here (the reader picks a
decoder for speed); this module only tells image extensions apart.

Pickle and ``torch.load`` members (``.pyd``, ``.pickle``, ``.pth``) can run arbitrary code when
loaded, so they stay raw bytes unless the caller passes ``allow_pickle=True``.
"""

from __future__ import annotations

import io
import json
import pickle
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardstream.errors import DecodeError, SourceError

__all__ = [
    "IMAGE_EXTENSIONS",
    "LABEL_EXTENSIONS",
    "PICKLE_EXTENSIONS",
    "decode_member",
    "encode_member",
    "extension_of",
    "is_image",
]

IMAGE_EXTENSIONS = frozenset(
    {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "tif", "tiff", "gif"}
)
LABEL_EXTENSIONS = frozenset({"cls", "cls2", "index", "label", "id"})
TEXT_EXTENSIONS = frozenset({"txt", "text", "transcript"})
JSON_EXTENSIONS = frozenset({"json", "jsn"})
PICKLE_EXTENSIONS = frozenset({"pyd", "pickle", "pkl", "pth"})


def extension_of(member_extension: str) -> str:
    """The part of a member extension that picks its codec: ``"seg.PNG"`` -> ``"png"``."""
    return member_extension.rsplit(".", 1)[-1].lower()


def is_image(member_extension: str) -> bool:
    """True when the extension names an image format."""
    return extension_of(member_extension) in IMAGE_EXTENSIONS


def encode_member(member_extension: str, value: Any, where: str = "sample") -> bytes:
    """Encode one sample field to the bytes of its tar member.

    ``bytes`` pass through unchanged whatever the extension; ints become decimal text (``.cls``),
    dicts and lists JSON, strings UTF-8 and numpy arrays ``.npy`` (without pickle).

    Raises:
        SourceError: The value's type does not fit the extension; ``where`` names the sample.
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    kind = extension_of(member_extension)
    if isinstance(value, bool) or (kind in LABEL_EXTENSIONS and not isinstance(value, int)):
        raise SourceError(
            f"{where}: field {member_extension!r} must be an int label or bytes, got "
            f"{type(value).__name__}"
        )
    if isinstance(value, (int, np.integer)):
        return str(int(value)).encode("ascii")
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (Mapping, list, tuple)) or kind in JSON_EXTENSIONS:
        try:
            return json.dumps(value, sort_keys=True, separators=(",", ":")).encode("utf-8")
        except TypeError as error:
            raise SourceError(
                f"{where}: field {member_extension!r} is not JSON-serializable: {error}"
            ) from error
    if isinstance(value, np.ndarray) and kind == "npy":
        buffer = io.BytesIO()
        np.save(buffer, value, allow_pickle=False)
        return buffer.getvalue()
    raise SourceError(
        f"{where}: cannot encode field {member_extension!r} of type {type(value).__name__}; "
        "pass bytes, int, str, dict/list (JSON) or a numpy array with extension 'npy'"
    )


#: The most bytes a gzipped member may decompress to (a larger one is refused, not held).
MAX_GUNZIPPED_BYTES = 1 << 30


def _gunzipped(data: bytes, member_extension: str, where: str) -> bytes:
    unzip = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        plain = unzip.decompress(data, MAX_GUNZIPPED_BYTES + 1)
    except zlib.error as error:
        raise DecodeError(
            f"{where}: member {member_extension!r} ({len(data)} bytes) is not valid gzip: {error}"
        ) from error
    if len(plain) > MAX_GUNZIPPED_BYTES or unzip.unconsumed_tail:
        raise DecodeError(
            f"{where}: member {member_extension!r} decompresses to more than "
            f"{MAX_GUNZIPPED_BYTES} bytes; refused"
        )
    return plain


def decode_member(
    member_extension: str, data: bytes, where: str = "sample", allow_pickle: bool = False
) -> Any:
    """Decode a non-image member by extension; unknown extensions (and images) stay bytes.

    A gzipped member (``txt.gz``, ``json.gz``...) is decompressed and decoded by its inner
    extension, as webdataset does.

    Raises:
        DecodeError: The bytes do not parse as the extension says; ``where`` names shard and key.
    """
    kind = extension_of(member_extension)
    if not isinstance(data, bytes):
        data = bytes(data)  # readers hand over buffer slices; fields are always bytes
    if kind == "gz" and "." in member_extension:  # "txt.gz": decoded as "txt", as webdataset does
        inner = member_extension.rsplit(".", 1)[0]
        return decode_member(inner, _gunzipped(data, member_extension, where), where, allow_pickle)
    try:
        if kind in LABEL_EXTENSIONS:
            return int(data)
        if kind in JSON_EXTENSIONS:
            return json.loads(data)
        if kind in TEXT_EXTENSIONS:
            return data.decode("utf-8")
        if kind == "npy":
            return np.load(io.BytesIO(data), allow_pickle=False)
        if kind in PICKLE_EXTENSIONS and allow_pickle:
            if kind == "pth":
                import torch  # only reached when the user opted in

                return torch.load(io.BytesIO(data), weights_only=False)
            return pickle.loads(data)
    except Exception as error:
        raise DecodeError(
            f"{where}: member {member_extension!r} ({len(data)} bytes) does not decode as "
            f"{kind!r}: {error}"
        ) from error
    return data
