"""Image checks and optional re-encoding (PIL); pass-through bytes are never re-encoded.

:func:`check_image` is the cheap guard used when bytes pass through unchanged: JPEG and PNG are
checked by their signature and end marker (which catches garbage and truncated files without
decoding), other formats by PIL's header parser. :func:`reencode_jpeg` serves ``resize`` and
``quality``: JPEGs are decoded at reduced scale with ``Image.draft`` when much larger than the
target, which makes resizing several times faster. :func:`decode_pixels` serves ``pixels``:
the image decoded once, resized, and stored as ``uint8`` pixels (:mod:`shardstream.format.pixels`).
"""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, UnidentifiedImageError

from shardstream.errors import SourceError
from shardstream.format.pixels import PixelSize

__all__ = [
    "DEFAULT_QUALITY",
    "check_image",
    "decode_pixels",
    "normalized_extension",
    "reencode_jpeg",
]

DEFAULT_QUALITY = 90
_JPEG_START = b"\xff\xd8\xff"
_JPEG_END = b"\xff\xd9"
_PNG_START = b"\x89PNG\r\n\x1a\n"
_PNG_END = b"IEND"
#: Bytes searched for the end marker: cameras may append trailing data after it.
_TAIL_SEARCH = 64 * 1024
_EXTENSIONS = {"jpeg": "jpg", "tiff": "tif"}


def normalized_extension(path: str) -> str:
    """Member extension for an image file: ``.JPEG``/``.jpeg`` -> ``jpg``, else lower-cased."""
    extension = path.rpartition(".")[2].lower()
    return _EXTENSIONS.get(extension, extension)


def check_image(data: bytes, extension: str, where: str) -> None:
    """Raise :class:`SourceError` when ``data`` is clearly not a complete image.

    Raises:
        SourceError: Empty, wrong signature, truncated (no end marker) or unparseable header.
    """
    if not data:
        raise SourceError(f"{where}: empty file (0 bytes); expected an image")
    if extension == "jpg":
        _check_markers(data, _JPEG_START, _JPEG_END, "JPEG", where)
    elif extension == "png":
        _check_markers(data, _PNG_START, _PNG_END, "PNG", where)
    else:
        try:
            with Image.open(io.BytesIO(data)):
                pass
        except (UnidentifiedImageError, OSError, ValueError) as error:
            raise SourceError(f"{where}: not a readable image ({error})") from error


def _check_markers(data: bytes, start: bytes, end: bytes, kind: str, where: str) -> None:
    if not data.startswith(start):
        raise SourceError(
            f"{where}: not a {kind} file (expected signature {start!r}, found "
            f"{data[: len(start)]!r}); fix or remove the file, or pass on_error='skip'"
        )
    if data.rfind(end, max(0, len(data) - _TAIL_SEARCH)) < 0:
        raise SourceError(
            f"{where}: truncated {kind} ({len(data)} bytes, no end marker {end!r} found); "
            "re-download or remove the file, or pass on_error='skip'"
        )


def reencode_jpeg(data: bytes, shorter_side: int | None, quality: int | None, where: str) -> bytes:
    """Decode an image, shrink its shorter side to ``shorter_side`` (aspect kept) and save JPEG.

    Images whose shorter side is already at most ``shorter_side`` are not enlarged.

    Raises:
        SourceError: The image cannot be decoded.
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            if shorter_side and image.format == "JPEG":
                scale = shorter_side / min(image.size)
                image.draft("RGB", (int(image.width * scale), int(image.height * scale)))
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise SourceError(f"{where}: cannot decode image ({error})") from error
    if shorter_side and min(rgb.size) > shorter_side:
        width, height = rgb.size
        scale = shorter_side / min(width, height)
        target = (
            (shorter_side, max(1, round(height * scale)))
            if width <= height
            else (max(1, round(width * scale)), shorter_side)
        )
        rgb = rgb.resize(target, Image.Resampling.BICUBIC, reducing_gap=None)
    buffer = io.BytesIO()
    rgb.save(buffer, format="JPEG", quality=quality or DEFAULT_QUALITY)
    return buffer.getvalue()


def decode_pixels(data: bytes, size: PixelSize, where: str) -> np.ndarray:
    """Decode an image to RGB and resize it to ``size``: ``uint8`` of shape ``(height, width, 3)``.

    Large JPEGs are decoded at reduced DCT scale first (never below the target), then resized
    with Pillow's antialiased bicubic filter, as ``resize`` re-encoding does.

    Raises:
        SourceError: The image cannot be decoded.
    """
    try:
        with Image.open(io.BytesIO(data)) as image:
            width, height = size.target(*image.size)
            if image.format == "JPEG":
                image.draft("RGB", (width, height))
            rgb = image.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as error:
        raise SourceError(f"{where}: cannot decode image ({error})") from error
    if rgb.size != (width, height):
        rgb = rgb.resize((width, height), Image.Resampling.BICUBIC, reducing_gap=None)
    return np.asarray(rgb)
