"""Crop, resize, flip and normalise decoded images on their device, as the CPU path does.

:func:`resize_crop_into` crops one decoded image by its drawn box and resizes it with the
antialiased bilinear filter of ``RandomResizedCrop`` (torch's ``interpolate(...,
antialias=True)``, the filter Pillow and torchvision use) into one slot of the batch.
:func:`finish_batch` then rounds to whole ``uint8`` levels (the CPU path resizes ``uint8``
tensors), applies the drawn flips, and the recipe's ``ToDtype``/``Normalize`` affine map, in a
few batched operations. Per image the device sees a cast and one resize; the rest is per batch.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardstream.streaming.decoding.encoded import CropRecipe

__all__ = ["empty_batch", "finish_batch", "resize_crop_into", "to_device_index"]


def empty_batch(count: int, recipe: CropRecipe, device: Any) -> Any:
    """An uninitialised ``(count, 3, height, width)`` batch of the recipe's working dtype."""
    import torch

    dtype = torch.float64 if recipe.dtype == "float64" else torch.float32
    return torch.empty((count, 3, *recipe.size), dtype=dtype, device=device)


def resize_crop_into(batch: Any, slot: int, image: Any, row: Any) -> None:
    """Resize the crop ``row[:4]`` (top, left, height, width) of ``image`` into ``batch[slot]``.

    Two device operations per image: a cast of the crop to the batch's float dtype, and the
    antialiased bilinear resize written straight into its slot (the kernel behind
    ``interpolate(..., mode="bilinear", antialias=True)``, without its Python checks).

    Args:
        batch: The ``(n, 3, H, W)`` float batch.
        slot: Where this image goes in it.
        image: A decoded ``uint8`` ``(3, h, w)`` tensor on the same device (any strides).
        row: The image's parameter row (see :data:`~.encoded.PARAM_COLUMNS`).
    """
    import torch

    top, left, height, width = int(row[0]), int(row[1]), int(row[2]), int(row[3])
    crop = image[:, top : top + height, left : left + width].unsqueeze(0).to(batch.dtype)
    size = [int(batch.shape[-2]), int(batch.shape[-1])]
    out = batch[slot : slot + 1]
    torch.ops.aten._upsample_bilinear2d_aa.out(crop, size, False, None, None, out=out)


def to_device_index(values: np.ndarray, device: Any) -> Any:
    """Host indexes as a device tensor, copied from page-locked memory without a host wait.

    A copy from pageable memory would wait for the stream's earlier work first, which would
    stall the host behind the previous batch's decode.
    """
    import torch

    host = torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64))
    if device.type != "cuda":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def finish_batch(batch: Any, params: np.ndarray, recipe: CropRecipe, cache: dict) -> Any:
    """Round, flip and normalise a resized batch in place; returns the output tensor.

    Args:
        batch: ``(n, 3, H, W)`` float tensor of resized crops.
        params: The ``n`` images' parameter rows (host ``int`` array).
        recipe: Output dtype and affine map.
        cache: Per-device cache of the recipe's constants (filled here).
    """
    import torch

    batch.round_().clamp_(0, 255)  # the CPU path resizes uint8 tensors: whole levels
    for column, dim in ((4, -1), (5, -2)):
        flipped = np.flatnonzero(params[:, column])
        if len(flipped) == len(params) and len(params):
            batch = batch.flip(dim)
        elif len(flipped):
            index = to_device_index(flipped, batch.device)
            batch[index] = batch[index].flip(dim)
    if recipe.scale is not None and recipe.shift is not None:
        key = (recipe, batch.device, batch.dtype)
        if key not in cache:
            scale = torch.tensor(recipe.scale, dtype=torch.float64).view(-1, 1, 1)
            shift = torch.tensor(recipe.shift, dtype=torch.float64).view(-1, 1, 1)
            cache[key] = (scale.to(batch.device, batch.dtype), shift.to(batch.device, batch.dtype))
        scale, shift = cache[key]
        batch.mul_(scale).add_(shift)
    if recipe.dtype is None:
        batch = batch.to(torch.uint8)
    if recipe.as_image:
        from torchvision import tv_tensors

        batch = tv_tensors.Image(batch)
    return batch
