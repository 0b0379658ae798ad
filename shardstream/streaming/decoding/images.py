"""Decoding one image: Pillow modes, reduced-scale JPEG decoding, libjpeg-turbo to a tensor.

Modes: ``"pil"`` gives ``PIL.Image`` (RGB), ``"rgb8"`` a ``uint8`` tensor of shape ``(3, H, W)``.
Images are decoded by Pillow (libjpeg-turbo); when the transform will shrink every image to at
least ``min_side`` pixels anyway (see :func:`min_side_of`), large JPEGs are decoded at a reduced
DCT scale (Pillow ``draft``), several times faster and losing nothing the transform keeps.
"""

from __future__ import annotations

import io
import math
import warnings
from typing import Any

import numpy as np

from shardstream.format import codecs

__all__ = ["decode_image", "decode_jpeg_rgb", "min_side_of", "writable_bytes"]


def min_side_of(transform: Any) -> int | None:
    """The shortest image side the transform needs to lose nothing, or None if unknown.

    Looks at the first geometric step of a torchvision (v2) ``Compose``: ``Resize(s)`` needs
    ``s``; ``CenterCrop``/``RandomCrop`` cannot shrink; ``RandomResizedCrop(s, scale=(a, b))``
    needs ``s / sqrt(a)`` (its smallest crop is scaled up to ``s``).
    """
    steps = getattr(transform, "transforms", [transform])
    for step in steps:
        name = type(step).__name__
        size = getattr(step, "size", None)
        if isinstance(size, (list, tuple)):
            size = max(size) if size else None
        if name == "Resize" and isinstance(size, int) and getattr(step, "max_size", None) is None:
            return size
        if name == "RandomResizedCrop" and isinstance(size, int):
            return math.ceil(size / math.sqrt(step.scale[0]))
        if name in {"Resize", "RandomResizedCrop", "CenterCrop", "RandomCrop", "FiveCrop"}:
            return None
        if name in {"ToImage", "PILToTensor", "RandomHorizontalFlip", "RandomVerticalFlip"}:
            continue
        return None
    return None


def decode_image(data: bytes, extension: str, mode: str, min_side: int | None = None) -> Any:
    """Decode image bytes into a PIL image (``"pil"``) or a uint8 CHW tensor (``"rgb8"``)."""
    from PIL import Image

    is_jpeg = codecs.extension_of(extension) in ("jpg", "jpeg")
    image: Image.Image = Image.open(io.BytesIO(data))
    if is_jpeg and min_side is not None and min(image.size) >= 2 * min_side:
        image.draft("RGB", (min_side, min_side))
    image = image.convert("RGB")
    if mode == "pil":
        return image
    import torch

    return torch.from_numpy(np.array(image)).permute(2, 0, 1)


def writable_bytes(blob: Any) -> bool:
    """True for a non-empty buffer ``torch.frombuffer`` can wrap without a copy or a warning."""
    if isinstance(blob, memoryview):
        return not blob.readonly and blob.nbytes > 0 and blob.contiguous
    return isinstance(blob, bytearray) and len(blob) > 0


def decode_jpeg_rgb(data: bytes) -> Any:
    """Decode JPEG bytes to a ``uint8`` RGB CHW tensor with libjpeg-turbo (torchvision).

    ``torchvision.io.decode_jpeg`` warns that it is deprecated (torchvision 0.29); that one
    warning is silenced here, where the replacement would be no faster.
    """
    import torch
    from torchvision import io as tvio

    encoded = torch.frombuffer(data if writable_bytes(data) else bytearray(data), dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="The image decoding and encoding capabilities of TorchVision are deprecated",
            category=DeprecationWarning,
        )
        return tvio.decode_jpeg(encoded, mode=tvio.ImageReadMode.RGB)
