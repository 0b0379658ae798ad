"""Pixel members as images: no decode, the crop and resize straight on the stored pixels.

A ``KEY.pixels.npy`` member (:mod:`shardstream.format.pixels`, written by ``build --pixels``)
is already ``uint8`` height x width x 3. :func:`pixel_tensor` wraps the reader's buffer as a
``(3, H, W)`` tensor with channels-last strides and no copy (the shard's memory map locally);
:func:`pixel_image` hands it out in a decode mode; :func:`crop_pixels` is the
``RandomResizedCrop`` step of :class:`~.fastcrop.CropDecoder` for such members: the crop drawn
with the transform's own ``make_params`` (the same torch RNG draws as the JPEG path and as
torchvision on a decoded image), then resized with torch's antialiased bilinear ``uint8``
kernel on the crop's channels-last block (the pixels torchvision's ``resized_crop`` gives).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardstream.format.pixels import pixel_array

__all__ = ["crop_pixels", "pixel_image", "pixel_tensor"]


def pixel_tensor(data: Any, where: str = "") -> Any:
    """A pixel member as a ``uint8`` tensor of shape ``(3, height, width)`` (a permuted view).

    The tensor shares the reader's buffer when that buffer is writable (a copy-on-write map,
    a receive buffer); read-only bytes are copied once, as torch wraps only writable memory.

    Raises:
        DecodeError: The member is not a pixel array (see
            :func:`~shardstream.format.pixels.pixel_array`).
    """
    import torch

    array = pixel_array(data, where)
    if not array.flags.writeable:
        array = array.copy()
    return torch.from_numpy(array).permute(2, 0, 1)


def pixel_image(data: Any, mode: str, where: str = "") -> Any:
    """A pixel member in a decode mode: ``"rgb8"`` a contiguous ``(3, H, W)`` tensor (a copy,
    the caller may change it), ``"pil"`` an RGB ``PIL.Image``."""
    if mode == "pil":
        from PIL import Image

        return Image.fromarray(np.ascontiguousarray(pixel_array(data, where)), "RGB")
    import torch

    return pixel_tensor(data, where).contiguous(memory_format=torch.contiguous_format)


def crop_pixels(crop: Any, out_size: tuple[int, int], data: Any, where: str = "") -> Any:
    """``RandomResizedCrop`` on a pixel member: the crop drawn, cut and resized to ``out_size``.

    The crop's pixels are copied out of the reader's buffer as one channels-last block (what
    torch's vectorised ``uint8`` antialiased bilinear kernel reads), then resized: the same
    pixels as torchvision's ``resized_crop`` on the image, several times faster than on the
    permuted view.

    Args:
        crop: The transform's ``v2.RandomResizedCrop`` (its ``make_params`` draws the box).
        out_size: Output ``(height, width)``.
        data: The member's bytes.
        where: Names the shard and key in errors.

    Returns:
        A ``uint8`` ``(3, height, width)`` tensor (channels-last strides) that never shares the
        reader's buffer.
    """
    import torch

    pixels = pixel_tensor(data, where)
    params = crop.make_params([pixels])
    top, left = params["top"], params["left"]
    box = pixels[:, top : top + params["height"], left : left + params["width"]]
    block = box.unsqueeze(0).contiguous(memory_format=torch.channels_last)
    resized = torch.nn.functional.interpolate(
        block, size=list(out_size), mode="bilinear", align_corners=False, antialias=True
    )[0]
    if resized.untyped_storage().data_ptr() == pixels.untyped_storage().data_ptr():
        resized = resized.clone()  # never hand out the reader's buffer
    return resized
