"""Pixel members: images stored decoded, as ``uint8`` height x width x 3 ``.npy`` arrays.

A sample's ``KEY.pixels.npy`` member is a NumPy ``.npy`` file (format 1.0, no pickle) that
``numpy.load`` and the ``webdataset`` library read as they read any ``.npy``; readers of
shardstream see it as the sample's image, already decoded. :class:`PixelSize` is the size the
writer stores (``"short=256"``: shorter side 256, aspect kept; ``"256x192"``: a fixed box,
width x height). :func:`encode_pixels` writes one member, :func:`pixel_array` reads one back
as a view of the reader's buffer (no copy), checking the header against what this module
writes, so a wrong member fails with its key rather than as a torn array.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import numpy as np

from shardstream.errors import ConfigError, DecodeError

__all__ = [
    "PIXELS_EXTENSION",
    "PixelSize",
    "encode_pixels",
    "is_pixels",
    "pixel_array",
    "pixel_shape",
]

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
