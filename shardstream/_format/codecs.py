"""Member encoding and decoding by file extension, shared by the writer and the reader.

A WebDataset sample is a group of tar members ``KEY.EXT``; the extension says how the bytes are
encoded. This module turns Python values into member bytes (writer) and member bytes back into
values (reader) for the common extensions. Images are not decoded here (the reader picks a
decoder for speed); this module only tells image extensions apart.

Pickle and ``torch.load`` members (``.pyd``, ``.pickle``, ``.pth``) can run arbitrary code when
loaded, so they stay raw bytes unless the caller passes ``allow_pickle=True``.

Pixel members: images stored decoded, as ``uint8`` height x width x 3 ``.npy`` arrays.

A sample's ``KEY.pixels.npy`` member is a NumPy ``.npy`` file (format 1.0, no pickle) that
``numpy.load`` and the ``webdataset`` library read as they read any ``.npy``; readers of
shardstream see it as the sample's image, already decoded. :class:`PixelSize` is the size the
writer stores (``"short=256"``: shorter side 256, aspect kept; ``"256x192"``: a fixed box,
width x height). :func:`encode_pixels` writes one member, :func:`pixel_array` reads one back
as a view of the reader's buffer (no copy), checking the header against what this module
writes, so a wrong member fails with its key rather than as a torn array."""

from __future__ import annotations

import dataclasses
import io
import json
import pickle
import re
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardstream.errors import ConfigError, DecodeError, SourceError

__all__ = [
    "IMAGE_EXTENSIONS",
    "LABEL_EXTENSIONS",
    "PICKLE_EXTENSIONS",
    "PIXELS_EXTENSION",
    "PixelSize",
    "decode_member",
    "encode_member",
    "encode_pixels",
    "extension_of",
    "is_image",
    "is_pixels",
    "pixel_array",
    "pixel_shape",
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


#: The member extension of pixel images (``webdataset`` decodes it by its last part, ``npy``).
PIXELS_EXTENSION = "pixels.npy"
_MAGIC = b"\x93NUMPY\x01\x00"
#: The header this module writes: 10 bytes, then the dict padded with spaces to 118 bytes.
_HEADER_BYTES = 128
_HEADER = re.compile(
    rb"\{'descr': '\|u1', 'fortran_order': False, 'shape': \((\d+), (\d+), (\d+)\), \} *\n"
)
_SPEC = re.compile(r"(?:short=(\d+)|(?:box=)?(\d+)x(\d+))")


def is_pixels(member_extension: str) -> bool:
    """True for the extension of a pixel member (``pixels.npy``, any letter case)."""
    return member_extension.lower() == PIXELS_EXTENSION


@dataclasses.dataclass(frozen=True)
class PixelSize:
    """The size pixel images are stored at: a shorter side (aspect kept) or a fixed box.

    Attributes:
        shorter_side: Resize so that the shorter side is exactly this many pixels (larger and
            smaller images alike), keeping the aspect; None with a box.
        box: ``(width, height)`` every image is resized to (aspect not kept); None with a side.

    Example:
        >>> PixelSize.parse("short=256"), PixelSize.parse("320x240").box
        (PixelSize(shorter_side=256, box=None), (320, 240))
    """

    shorter_side: int | None = None
    box: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        sides = [self.shorter_side] if self.box is None else list(self.box)
        values = [side for side in sides if side is not None]
        if (self.shorter_side is None) == (self.box is None) or min(values) < 1:
            raise ConfigError(
                f"pixels needs a shorter side >= 1 or a box of two sides >= 1, got {self!r}"
            )
        if max(values) > 16384:
            raise ConfigError(f"pixels sides are at most 16384, got {self!r}")

    @classmethod
    def parse(cls, text: str) -> PixelSize:
        """``"short=N"`` (shorter side N, aspect kept) or ``"WxH"`` / ``"box=WxH"``.

        Raises:
            ConfigError: Any other text; the message shows the accepted forms.
        """
        match = _SPEC.fullmatch(text.strip().lower())
        if match is None:
            raise ConfigError(
                f"pixels must be 'short=N' (shorter side N, aspect kept) or 'WxH' (a fixed box, "
                f"e.g. '256x256'), got {text!r}"
            )
        if match.group(1) is not None:
            return cls(shorter_side=int(match.group(1)))
        return cls(box=(int(match.group(2)), int(match.group(3))))

    def __str__(self) -> str:
        if self.box is not None:
            return f"{self.box[0]}x{self.box[1]}"
        return f"short={self.shorter_side}"

    def target(self, width: int, height: int) -> tuple[int, int]:
        """The stored ``(width, height)`` of an image of ``width`` x ``height`` pixels."""
        if self.box is not None:
            return self.box
        side = int(self.shorter_side or 1)
        if width <= height:
            return side, max(1, round(height * side / width))
        return max(1, round(width * side / height)), side


def encode_pixels(pixels: np.ndarray) -> bytes:
    """The ``.npy`` bytes of a ``uint8`` array of shape ``(height, width, 3)``.

    The header is always 128 bytes (``numpy.save`` pads it the same way for these shapes), so
    the pixels start at a fixed offset of the member.

    Raises:
        ValueError: Not a C-ordered ``uint8`` array of shape ``(height, width, 3)``.
    """
    if pixels.dtype != np.uint8 or pixels.ndim != 3 or pixels.shape[2] != 3:
        raise ValueError(
            f"pixels must be uint8 (height, width, 3), got {pixels.dtype} {pixels.shape}"
        )
    height, width, channels = pixels.shape
    text = f"{{'descr': '|u1', 'fortran_order': False, 'shape': ({height}, {width}, {channels}), }}"
    header = text.encode("latin1").ljust(_HEADER_BYTES - len(_MAGIC) - 2 - 1) + b"\n"
    prefix = _MAGIC + len(header).to_bytes(2, "little")
    return prefix + header + np.ascontiguousarray(pixels).tobytes()


def pixel_array(data: Any, where: str) -> np.ndarray:
    """The ``(height, width, 3)`` ``uint8`` array of a pixel member: a view of ``data``.

    Args:
        data: The member's bytes (``bytes``, or a ``memoryview`` of the reader's buffer).
        where: Names the shard and key in errors.

    Raises:
        DecodeError: Not a pixel member as :func:`encode_pixels` writes it, or torn.
    """
    view = memoryview(data)
    header = bytes(view[:_HEADER_BYTES])
    match = _HEADER.fullmatch(header, 10) if header[:10] == _MAGIC + b"\x76\x00" else None
    if match is None:
        raise DecodeError(
            f"{where}: member {PIXELS_EXTENSION!r} is not a uint8 (height, width, 3) .npy array "
            f"as `shardstream build --pixels` writes it (header {header[:64]!r}); rebuild the "
            "shard with --pixels, or name other arrays '.npy' rather than '.pixels.npy'"
        )
    height, width, channels = (int(value) for value in match.groups())
    size = height * width * channels
    if channels != 3 or len(view) != _HEADER_BYTES + size:
        raise DecodeError(
            f"{where}: member {PIXELS_EXTENSION!r} of shape ({height}, {width}, {channels}) "
            f"needs {_HEADER_BYTES + size} bytes with 3 channels, found {len(view)} bytes; the "
            "shard is damaged or was not written by `shardstream build --pixels`: rebuild it"
        )
    return np.frombuffer(view, np.uint8, size, _HEADER_BYTES).reshape(height, width, 3)


def pixel_shape(data: Any) -> tuple[int, int] | None:
    """``(height, width)`` of a pixel member as :func:`encode_pixels` writes it, else None."""
    try:
        height, width, _ = pixel_array(data, "").shape
    except DecodeError:
        return None
    return height, width
