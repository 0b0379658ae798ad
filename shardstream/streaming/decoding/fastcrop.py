"""Fast path for ``RandomResizedCrop``-first transforms: draw the crop, then decode only enough.

The generic path decodes the whole JPEG at full size and lets the transform crop and shrink it.
For a torchvision v2 ``Compose`` that starts with ``RandomResizedCrop``, :class:`CropDecoder`
instead reads the image size from the JPEG header (no decoding), draws the crop with the
transform's own ``make_params`` (same distribution, same torch RNG draws, so seeded runs stay
deterministic), and then, by what measured fastest for that crop:

- with ``shardstream[fastjpeg]`` (nvImageCodec) installed, unless the crop is at least 4x the
  output on both sides: decodes only the crop window (:mod:`.jpegcrop`), skipping the rows
  below the crop and the colour work outside it (faster than a full decode, README:
  *Streaming*), and the same pixels;
- crop at least 2x (4x, 8x) the output on both sides: decodes at 1/2 (1/4, 1/8) DCT scale
  (Pillow ``draft``) -- only resolution that the resize would throw away is skipped (for 1/2,
  only without the window decoder: there a full-resolution window is as fast or faster);
- otherwise decodes at full size with libjpeg-turbo through ``torchvision.io.decode_jpeg``
  (measured faster than Pillow here);

then resizes the crop on the ``uint8`` tensor (torch's antialiased bilinear ``uint8`` kernel),
and runs the remaining steps fused (:class:`FusedTail`: flips on ``uint8``, then
``ToDtype``/``Normalize`` as one multiply-add) when they are the usual ones. Pixels match the
generic path within resampling rounding. Anything else (non-JPEG, other transforms, other
interpolation) takes the generic path. Pixel members (``build --pixels``) skip the decode:
the crop is drawn the same way and cut from their stored pixels (:mod:`.pixelcrop`).
"""

from __future__ import annotations

import contextlib
import io
import math
from typing import Any

import numpy as np

from shardstream.format import codecs
from shardstream.format.pixels import is_pixels
from shardstream.streaming.decoding import jpegcrop
from shardstream.streaming.decoding.images import decode_image, decode_jpeg_rgb
from shardstream.streaming.decoding.pixelcrop import crop_pixels

__all__ = ["CropDecoder", "FusedTail", "crop_decoder_for", "fuse_tail"]

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
    if transform is None or mode not in ("pil", "rgb8"):
        return None  # before importing torchvision's transforms, which raw loading never needs
    from torchvision.transforms import v2

    if not isinstance(transform, v2.Compose):
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
        # v2.Compose refuses no steps: Compose([RandomResizedCrop(224)]) has none after the crop
        self.rest = v2.Compose(list(transform.transforms[1:]) or [v2.Identity()])
        self.tail = fuse_tail(transform.transforms[1:])  # None: run ``rest`` step by step
        height, width = self.crop.size
        self.out_size = (int(height), int(width))

    def __call__(self, data: bytes, extension: str) -> Any:
        """Decode, crop, resize and transform one image; the generic path for non-JPEGs.

        Pixel members (``build --pixels``) are not decoded: the crop is cut from their pixels
        (:func:`.pixelcrop.crop_pixels`), drawn as for a JPEG of that size."""
        from PIL import Image

        if is_pixels(extension):
            pixels = crop_pixels(self.crop, self.out_size, data)
            return self.rest(pixels) if self.tail is None else self.tail(pixels)
        image = None
        if codecs.extension_of(extension) in ("jpg", "jpeg"):
            image = Image.open(io.BytesIO(data))
        if image is None or image.format != "JPEG":
            return self.transform(decode_image(data, extension, self.mode))
        params = self.crop.make_params([image])
        pixels = self._decode_window(data, image, params)
        if pixels is None:
            pixels = self._resize(*self._decode(data, image, params), params)
        return self.rest(pixels) if self.tail is None else self.tail(pixels)

    def reduction(self, params: dict[str, int]) -> int:
        """Largest DCT reduction (1, 2, 4 or 8) keeping the crop >= the output on both sides."""
        out_height, out_width = self.out_size
        for factor in (8, 4, 2):
            if params["height"] >= factor * out_height and params["width"] >= factor * out_width:
                return factor
        return 1

    def _decode_window(self, data: bytes, image: Any, params: dict[str, int]) -> Any | None:
        """The resized crop from a crop-window decode (:mod:`.jpegcrop`), or None."""
        import torch
        from torchvision.transforms.v2 import functional

        if image.mode != "RGB" or self.reduction(params) > 2:
            return None  # grey, CMYK: Pillow's colours. 1/4 and 1/8 DCT scale beat the window
        box = params["top"], params["left"], params["height"], params["width"]
        window = jpegcrop.decode_window(data, *box)
        if window is None:
            return None
        array = np.asarray(window)  # no copy: nvImageCodec's buffer, kept alive by the array
        if not array.flags.writeable:  # torch warns about read-only arrays
            array = array.copy()
        pixels = torch.from_numpy(array).permute(2, 0, 1)
        return functional.resize(pixels, list(self.out_size), antialias=True)

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

    def _resize(self, pixels: Any, scale_x: float, scale_y: float, params: dict[str, int]) -> Any:
        from torchvision.transforms.v2 import functional

        top, left = round(params["top"] / scale_y), round(params["left"] / scale_x)
        height = max(1, min(round(params["height"] / scale_y), pixels.shape[-2] - top))
        width = max(1, min(round(params["width"] / scale_x), pixels.shape[-1] - left))
        return functional.resized_crop(
            pixels, top, left, height, width, list(self.out_size), antialias=True
        )


class FusedTail:
    """Flips, dtype conversion and ``Normalize`` after the crop, as one pass over the pixels.

    Same results as running the v2 steps one by one (to float rounding), same torch RNG draws
    in the same order: one ``torch.rand(1)`` per random flip, flipping when it is below ``p``,
    as ``v2.RandomHorizontalFlip`` does. Flips and per-channel affine maps commute, so the flips
    run first on the small ``uint8`` tensor, then one ``uint8 * scale + shift`` makes the float
    output (contiguous). Build one with :func:`fuse_tail`.
    """

    def __init__(
        self,
        flips: list[tuple[float, int]],
        dtype: Any,
        affine: tuple[list[float], list[float]] | None,
        as_image: bool,
    ) -> None:
        import torch

        self.flips, self.dtype, self.as_image = flips, dtype, as_image
        self.scale = self.shift = None
        if affine is not None:  # computed in float64, stored in the output dtype
            scale, shift = (torch.tensor(v, dtype=torch.float64).view(-1, 1, 1) for v in affine)
            self.scale, self.shift = scale.to(dtype), shift.to(dtype)

    def __call__(self, pixels: Any) -> Any:
        import torch
        from torchvision import tv_tensors

        for probability, dim in self.flips:
            if torch.rand(1) < probability:
                pixels = pixels.flip(dim)
        if self.scale is not None and self.shift is not None:
            # The multiply reads the (channels-last) resize output and writes CHW: no extra copy.
            out = torch.empty(pixels.shape, dtype=self.scale.dtype)
            pixels = torch.mul(pixels, self.scale, out=out).add_(self.shift)
        elif self.dtype is not None:
            pixels = pixels.to(self.dtype, memory_format=torch.contiguous_format)
        else:
            pixels = pixels.contiguous()
        return tv_tensors.Image(pixels) if self.as_image else pixels


def fuse_tail(steps: Any) -> FusedTail | None:
    """A :class:`FusedTail` for the v2 steps after ``RandomResizedCrop``, or None.

    Fuses exactly these v2 classes, on the ``uint8`` crop: ``RandomHorizontalFlip``,
    ``RandomVerticalFlip``, ``PILToTensor`` (a no-op on tensors), ``ToImage``, ``ToPureTensor``,
    ``ToDtype`` to ``float32``/``float64`` (once, from ``uint8``) and ``Normalize`` after it.
    Anything else (subclasses, v1 transforms, other dtypes, a zero std) returns None, and the
    steps then run one by one, with their own checks and errors.
    """
    import torch
    from torchvision.transforms import v2

    flips: list[tuple[float, int]] = []
    dtype, as_image = None, False
    scale: list[float] = [1.0]  # output = pixel * scale + shift, per channel
    shift: list[float] = [0.0]
    for step in steps:
        kind = type(step)
        if kind in (v2.RandomHorizontalFlip, v2.RandomVerticalFlip):
            flips.append((step.p, -1 if kind is v2.RandomHorizontalFlip else -2))
        elif kind in (v2.ToImage, v2.ToPureTensor):
            as_image = kind is v2.ToImage
        elif kind is v2.ToDtype and step.dtype == (dtype or torch.uint8):
            continue  # already that dtype: v2 returns the input unchanged
        elif kind is v2.ToDtype and dtype is None and step.dtype in (torch.float32, torch.float64):
            dtype = step.dtype
            scale = [1 / 255] if step.scale else [1.0]
        elif kind is v2.Normalize and dtype is not None and _fits(step.mean, step.std):
            mean, std = _per_channel(step.mean), _per_channel(step.std)
            scale = [a / s for a, s in zip(_per_channel(scale), std, strict=True)]
            shift = [(b - m) / s for b, m, s in zip(_per_channel(shift), mean, std, strict=True)]
        elif kind is not v2.PILToTensor:
            return None
    identity = scale == [1.0] and shift == [0.0]
    return FusedTail(flips, dtype, None if identity else (scale, shift), as_image)


def _fits(mean: Any, std: Any) -> bool:
    """Per-channel (1 or 3 values) statistics with no zero std, as Normalize accepts for RGB."""
    return len(mean) in (1, 3) and len(std) in (1, 3) and all(float(s) != 0 for s in std)


def _per_channel(values: Any) -> list[float]:
    values = [float(v) for v in values]
    return values * 3 if len(values) == 1 else values
