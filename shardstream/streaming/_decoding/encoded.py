"""Encoded images that leave the DataLoader workers for a device decoder, with their crops drawn.

With ``decode="cuda"`` (see :mod:`.gpudecode`) a worker does not decode: it reads the image
size from the header, draws the ``RandomResizedCrop`` box and the flips exactly as the CPU path
would (the draws of the transform's own ``make_params``, then one ``torch.rand(1)`` per flip,
in the same order, on the worker's RNG), and hands the encoded bytes on with those parameters.
The decode, crop, resize, flips and normalisation then run on the device in the training
process. A pixel member (``build --pixels``) has nothing to decode: its crop is drawn the same
way and only the crop's pixels are handed over (``uint8`` height x width x 3, marked in the
``pixels`` column).

A :class:`CropRecipe` says what the fused steps after the crop do (the output size, dtype and
per-channel affine map of ``ToDtype``/``Normalize``); an :class:`EncodedBatch` carries the
bytes (one flat buffer of views), an ``int32`` table of parameters, the keys and shards (for
error messages) and the recipe, so any :class:`~.gpudecode.GpuDecode` can finish it.
"""

from __future__ import annotations

import dataclasses
import io
from collections.abc import Sequence
from typing import Any, NamedTuple

from shardstream._format.codecs import is_pixels, pixel_array
from shardstream.streaming._decoding.fastcrop import draw_crop_box, draw_pixel_crop

__all__ = [
    "PARAM_COLUMNS",
    "PIXELS",
    "CropDraw",
    "CropRecipe",
    "EncodedBatch",
    "EncodedImage",
    "crop_draw_for",
    "KeepEncoded",
    "flat_bytes",
]

#: Columns of an :class:`EncodedBatch`'s parameter table, one row per image.
PARAM_COLUMNS = (
    "top",
    "left",
    "height",
    "width",
    "hflip",
    "vflip",
    "image_height",
    "image_width",
    "pixels",  # 1: the data is the crop's uint8 pixels (height x width x 3), not an encoded image
)
#: The ``pixels`` column's index.
PIXELS = PARAM_COLUMNS.index("pixels")


@dataclasses.dataclass(frozen=True)
class CropRecipe:
    """What happens after the crop: resize to ``size``, then ``pixel * scale + shift``.

    Attributes:
        size: Output ``(height, width)``.
        dtype: Output dtype name (``"float32"``, ``"float64"``) or None for ``uint8``.
        scale: Per-channel multiplier (3 values), or None (no affine map).
        shift: Per-channel offset (3 values), or None.
        as_image: Wrap the output as a torchvision ``tv_tensors.Image``.
    """

    size: tuple[int, int]
    dtype: str | None
    scale: tuple[float, ...] | None
    shift: tuple[float, ...] | None
    as_image: bool


class EncodedImage(NamedTuple):
    """One encoded image with its drawn parameters (a row of :data:`PARAM_COLUMNS`)."""

    data: Any
    params: tuple[int, ...]
    key: str
    url: str
    recipe: CropRecipe | None


@dataclasses.dataclass
class EncodedBatch:
    """Encoded images of one batch, for :class:`~.gpudecode.GpuDecode` to decode on a device.

    Attributes:
        images: 1-D ``uint8`` tensors, views into one flat buffer (shared memory from workers).
        params: ``int32`` tensor of shape ``(n, 9)``, columns :data:`PARAM_COLUMNS`.
        keys: Each image's sample key.
        urls: Each image's shard URL.
        recipe: The steps after the crop, or None (no recognised transform: whole images).
    """

    images: list[Any]
    params: Any
    keys: list[str]
    urls: list[str]
    recipe: CropRecipe | None

    def __len__(self) -> int:
        return len(self.keys)

    def where(self, index: int) -> str:
        """``"<shard>: key '<key>'"`` of image ``index``, for messages."""
        return f"{self.urls[index]}: key {self.keys[index]!r}"

    def pin_memory(self, device: Any = None) -> EncodedBatch:
        """The same batch with its bytes in page-locked memory (``DataLoader(pin_memory=True)``).

        The images stay views into one buffer, so a device copy of the batch is one transfer.
        """
        del device  # the DataLoader passes its pin device; pinned host memory serves any
        flat, sizes = flat_bytes(self.images)
        return dataclasses.replace(self, images=list(flat.pin_memory().split(sizes)))


def flat_bytes(images: Sequence[Any]) -> tuple[Any, list[int]]:
    """``(one flat uint8 tensor of all the bytes, each image's size)``.

    Views packed by a worker lie back to back in one buffer: the flat tensor is then a view of
    it, with no copy; other tensors (made without workers) are concatenated.
    """
    import torch

    sizes = [int(view.numel()) for view in images]
    if not images:
        return torch.empty(0, dtype=torch.uint8), sizes
    first, storage = images[0], images[0].untyped_storage()
    offset, packed = first.storage_offset(), True
    for view in images:
        if view.untyped_storage().data_ptr() != storage.data_ptr() or (
            view.storage_offset() != offset or not view.is_contiguous()
        ):
            packed = False
            break
        offset += int(view.numel())
    if not packed:
        return torch.cat([view.reshape(-1) for view in images]), sizes
    whole = torch.empty(0, dtype=torch.uint8, device=first.device).set_(storage)
    return whole[first.storage_offset() : offset], sizes


def crop_draw_for(transform: Any) -> CropDraw | None:
    """A :class:`CropDraw` when ``transform`` is recognised by the crop fast path, else None.

    Recognised: what :func:`~.fastcrop.crop_decoder_for` takes (a v2 ``Compose`` starting with
    bilinear antialiased ``RandomResizedCrop``) whose later steps fuse into one pass
    (:func:`~.fastcrop.fuse_tail`: flips, ``ToImage``, ``ToDtype`` to float, ``Normalize``).
    """
    from shardstream.streaming._decoding.fastcrop import crop_decoder_for, fuse_tail

    if crop_decoder_for(transform, "rgb8") is None:
        return None
    tail = fuse_tail(transform.transforms[1:])
    if tail is None:
        return None
    return CropDraw(transform.transforms[0], tail)


class CropDraw:
    """Draws one image's crop and flips on this process's torch RNG, as the CPU path does.

    Args:
        crop: The transform's ``RandomResizedCrop``.
        tail: The fused steps after it (:class:`~.fastcrop.FusedTail`).
    """

    def __init__(self, crop: Any, tail: Any) -> None:
        self.crop, self.tail = crop, tail
        height, width = (int(side) for side in crop.size)
        dtype = None if tail.dtype is None else str(tail.dtype).removeprefix("torch.")
        scale = shift = None
        if tail.scale is not None and tail.shift is not None:
            scale = tuple(float(v) for v in tail.scale.flatten())
            shift = tuple(float(v) for v in tail.shift.flatten())
        self.recipe = CropRecipe((height, width), dtype, scale, shift, tail.as_image)

    def __call__(self, data: Any, extension: str) -> EncodedImage:
        """``data`` with its parameter row (:data:`PARAM_COLUMNS`); key and URL left empty.

        A pixel member's crop is drawn from its stored size (:func:`~.fastcrop.draw_crop_box`,
        as the CPU path draws) and only the crop's pixels are handed over.

        Raises:
            Exception: The header does not open as an image (PIL's error), or a pixel member is
                malformed (a ``DecodeError``); the caller wraps it naming the sample.
        """
        from PIL import Image

        if is_pixels(extension):
            crop, box, (height, width) = draw_pixel_crop(self.crop, data)
            row = (*box, *self._flips(), height, width, 1)
            return EncodedImage(crop.reshape(-1).data, row, "", "", self.recipe)
        image = Image.open(io.BytesIO(data))  # reads the header only
        width, height = image.size
        box = draw_crop_box(self.crop, height, width)
        return EncodedImage(data, (*box, *self._flips(), height, width, 0), "", "", self.recipe)

    def _flips(self) -> tuple[int, int]:
        """``(hflip, vflip)``: one ``torch.rand(1)`` per flip step, in order, as the v2 steps."""
        horizontal, vertical = self.tail.draw_flips()
        return int(horizontal), int(vertical)


class KeepEncoded:
    """Hands an image over encoded, with no drawn parameters (no recognised transform)."""

    recipe = None

    def __call__(self, data: Any, extension: str) -> EncodedImage:
        if is_pixels(extension):  # the whole image's pixels, a view of the member (no header)
            height, width, _ = pixel_array(data, "").shape
            pixels = memoryview(data)[len(data) - height * width * 3 :]
            return EncodedImage(pixels, (0, 0, height, width, 0, 0, height, width, 1), "", "", None)
        return EncodedImage(data, _NO_PARAMS, "", "", None)


_NO_PARAMS = (0,) * len(PARAM_COLUMNS)
