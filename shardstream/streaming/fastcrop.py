"""Fast path for ``RandomResizedCrop``-first transforms: draw the crop, then decode only enough.

The generic path decodes the whole JPEG at full size and lets the transform crop and shrink it.
For a torchvision v2 ``Compose`` that starts with ``RandomResizedCrop``, :class:`CropDecoder`
instead reads the image size from the JPEG header (no decoding), draws the crop with the
transform's own ``make_params`` (same distribution, same torch RNG draws, so seeded runs stay
deterministic), and then:

- if the crop is at least 2x (4x, 8x) the output on both sides, decodes at 1/2 (1/4, 1/8) DCT
  scale (Pillow ``draft``) -- only resolution that the resize would throw away is skipped;
- otherwise decodes at full size with libjpeg-turbo through ``torchvision.io.decode_jpeg``
  (measured faster than Pillow here);

crops the mapped box and resizes it on the ``uint8`` tensor (bilinear, antialiased), then runs
the remaining steps. Pixels match the generic path within resampling rounding. Anything else
(non-JPEG, other transforms, other interpolation) takes the generic path.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from typing import Any

import numpy as np

from shardstream import codecs

__all__ = ["CropDecoder", "crop_decoder_for"]

#: Steps after the crop that work on uint8 tensors as they do on PIL images.
_TENSOR_SAFE = {
    "RandomHorizontalFlip",
    "RandomVerticalFlip",
    "PILToTensor",
    "ToImage",
    "ToDtype",
    "ToPureTensor",
    "Normalize",
}


def crop_decoder_for(transform: Any, mode: str) -> CropDecoder | None:
    """A :class:`CropDecoder` when ``transform`` qualifies for the fast path, else None.

    Qualifies: a torchvision v2 ``Compose`` whose first step is ``RandomResizedCrop`` with
    bilinear, antialiased resizing, followed only by flips, ``PILToTensor``/``ToImage``,
    ``ToDtype``/``ToPureTensor`` and ``Normalize``; ``mode`` must be ``"pil"`` or ``"rgb8"``.
    """
    from torchvision.transforms import v2

    if mode not in ("pil", "rgb8") or not isinstance(transform, v2.Compose):
        return None
    steps = list(transform.transforms)
    first = steps[0] if steps else None
    if not isinstance(first, v2.RandomResizedCrop) or first.antialias is False:
        return None
    if str(getattr(first.interpolation, "value", first.interpolation)) != "bilinear":
        return None
    if any(type(step).__name__ not in _TENSOR_SAFE for step in steps[1:]):
        return None
    return CropDecoder(transform, mode)


class CropDecoder:
    """Decode + ``RandomResizedCrop`` + the remaining steps, decoding no more than needed.

    Use :func:`crop_decoder_for` to build one; call it as ``decoder(data, extension)``.

    Args:
        transform: A qualifying v2 ``Compose`` (see :func:`crop_decoder_for`).
        mode: The dataset's decode mode, used by the generic fallback.
    """

    def __init__(self, transform: Any, mode: str) -> None:
        from torchvision.transforms import v2

        self.transform, self.mode = transform, mode
        self.crop = transform.transforms[0]
        self.rest = v2.Compose(list(transform.transforms[1:]))
        height, width = self.crop.size
        self.out_size = (int(height), int(width))

    def __call__(self, data: bytes, extension: str) -> Any:
        """Decode, crop, resize and transform one image; the generic path for non-JPEGs."""
        from PIL import Image

        from shardstream.streaming.decode import decode_image

        image = None
        if codecs.extension_of(extension) in ("jpg", "jpeg"):
            image = Image.open(io.BytesIO(data))
        if image is None or image.format != "JPEG":
            return self.transform(decode_image(data, extension, self.mode))
        params = self.crop.make_params([image])
        pixels, scale_x, scale_y = self._decode(data, image, params)
        return self.rest(self._resize(pixels, params, scale_x, scale_y))

    def reduction(self, params: dict[str, int]) -> int:
        """Largest DCT reduction (1, 2, 4 or 8) keeping the crop >= the output on both sides."""
        out_height, out_width = self.out_size
        for factor in (8, 4, 2):
            if params["height"] >= factor * out_height and params["width"] >= factor * out_width:
                return factor
        return 1

    def _decode(self, data: bytes, image: Any, params: dict[str, int]) -> tuple[Any, float, float]:
        """Return ``(uint8 CHW tensor, x scale, y scale)`` of the decoded (maybe reduced) image."""
        import torch

        width, height = image.size
        factor = self.reduction(params)
        if factor == 1:
            with contextlib.suppress(RuntimeError):  # JPEG flavours torchvision rejects: Pillow
                return decode_jpeg_rgb(data), 1.0, 1.0
        else:
            image.draft("RGB", (math.ceil(width / factor), math.ceil(height / factor)))
        rgb = image.convert("RGB")
        pixels = torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1)
        return pixels, width / rgb.size[0], height / rgb.size[1]

    def _resize(self, pixels: Any, params: dict[str, int], scale_x: float, scale_y: float) -> Any:
        from torchvision.transforms.v2 import functional

        top, left = round(params["top"] / scale_y), round(params["left"] / scale_x)
        height = max(1, min(round(params["height"] / scale_y), pixels.shape[-2] - top))
        width = max(1, min(round(params["width"] / scale_x), pixels.shape[-1] - left))
        return functional.resized_crop(
            pixels, top, left, height, width, list(self.out_size), antialias=True
        )


def decode_jpeg_rgb(data: bytes) -> Any:
    """Decode JPEG bytes to a ``uint8`` RGB CHW tensor with libjpeg-turbo (torchvision).

    ``torchvision.io.decode_jpeg`` warns that it is deprecated (torchvision 0.29); that one
    warning is silenced here, where the replacement would be no faster.
    """
    import torch
    from torchvision import io as tvio

    encoded = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="The image decoding and encoding capabilities of TorchVision are deprecated",
            category=DeprecationWarning,
        )
        return tvio.decode_jpeg(encoded, mode=tvio.ImageReadMode.RGB)
