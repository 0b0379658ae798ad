"""One encoded batch through a device decoder: decode in parts, check, fall back, crop, finish.

Called by :class:`~.gpudecode.GpuDecode` inside its side stream. Images the device decoder
rejects, decodes to another size than the header said, or that end without a JPEG end marker
(truncated) are decoded by Pillow on the CPU; if Pillow fails too, the image is corrupt and
raises (or is skipped and counted), as on the CPU path.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any

import numpy as np

from shardstream.errors import DecodeError
from shardstream.streaming.decoding.encoded import EncodedBatch, flat_bytes
from shardstream.streaming.decoding.gpubackends import decode_with_pillow
from shardstream.streaming.decoding.gpuresize import empty_batch, finish_batch, resize_crop_into

__all__ = ["decode_encoded", "encoded_arrays", "truncated_jpegs"]

logger = logging.getLogger("shardstream.streaming")

#: A JPEG's end marker may be followed by a little padding; look for it this far from the end.
_END_MARKER_SPAN = 64


def encoded_arrays(batch: EncodedBatch) -> list[np.ndarray]:
    """Each image's bytes as a ``uint8`` array view (of one flat buffer when packed)."""
    flat, sizes = flat_bytes(batch.images)
    data = flat.numpy()
    bounds = np.concatenate([[0], np.cumsum(sizes)]).tolist()
    return [data[start:stop] for start, stop in itertools.pairwise(bounds)]


def truncated_jpegs(arrays: list[np.ndarray]) -> set[int]:
    """Indexes of JPEG streams with no end-of-image marker near their end (cut short)."""
    found = set()
    for index, data in enumerate(arrays):
        if len(data) < 4 or data[0] != 0xFF or data[1] != 0xD8:
            continue  # not a JPEG: Pillow decides
        if data[-2] == 0xFF and data[-1] == 0xD9:
            continue  # the usual ending, checked without a search
        if b"\xff\xd9" not in data[-_END_MARKER_SPAN:].tobytes():
            found.add(index)
    return found


def decode_encoded(run: Any, batch: EncodedBatch, alive: list[Any]) -> tuple[Any, list[int]]:
    """Decode, crop and finish ``batch`` on ``run``'s device, enqueued on the current stream.

    Args:
        run: The stage's per-process run (backend, order, counters, owner settings).
        batch: The encoded batch.
        alive: Filled with the objects that own memory the enqueued work still reads (also
            when this raises halfway), for the caller to keep until that work is done.

    Returns:
        ``(images, kept)``: the finished images (a tensor, or a list when their shapes
        differ), and the indexes of the images kept (all but skipped ones).

    Raises:
        DecodeError: An image is corrupt (``on_error="raise"``), or every image of a batch of
            several is (``"skip"``).
    """
    rows = np.asarray(batch.params.numpy(), dtype=np.int64).reshape(len(batch), -1)
    recipe, owner = batch.recipe, run.owner
    arrays = encoded_arrays(batch)
    truncated = truncated_jpegs(arrays)
    out = empty_batch(len(batch), recipe, run.device) if recipe is not None else None
    whole: list[Any] = []
    kept: list[int] = []
    alive.append(arrays)
    for start in range(0, len(batch), owner.max_images):
        part = range(start, min(len(batch), start + owner.max_images))
        todo = [i for i in part if i not in truncated]
        images = run.backend.decode([arrays[i] for i in todo], run.order.stream)
        decoded = dict(zip(todo, images, strict=True))
        alive.extend(run.backend.keepalive())
        for i in part:
            image = decoded.get(i)
            if image is None or (recipe is not None and not _fits(image, rows[i])):
                image = _decode_on_host(run, batch, arrays, i)
                if image is None:
                    continue
            if out is not None:
                resize_crop_into(out, len(kept), image, rows[i])
            else:
                whole.append(image if owner.transform is None else owner.transform(image))
            kept.append(i)
    run.counts["images"] += len(kept)
    if not kept and len(batch) > 1:
        raise DecodeError(
            f"all {len(batch)} images of one batch failed to decode (see the log); an empty "
            "batch cannot be collated. Check the shards with `shardstream verify`."
        )
    if out is not None and recipe is not None:
        return finish_batch(out[: len(kept)], rows[kept], recipe, run.constants), kept
    return _stack(whole), kept


def _fits(image: Any, row: np.ndarray) -> bool:
    """Whether a decoded image has the size its header gave (the crop was drawn for it)."""
    return tuple(image.shape) == (3, int(row[6]), int(row[7]))


def _decode_on_host(run: Any, batch: EncodedBatch, arrays: list[np.ndarray], index: int) -> Any:
    """Image ``index`` decoded by Pillow and moved to the device; None when skipped."""
    blob = arrays[index]
    try:
        pixels = decode_with_pillow(blob)
    except Exception as error:
        message = (
            f"{batch.where(index)}: image ({len(blob)} bytes) does not decode: {error}. "
            "Rebuild the shard, or pass on_error='skip' to skip and count such samples."
        )
        if run.owner.on_error == "skip":
            run.counts["skipped"] += 1
            logger.warning("skipping sample: %s", message)
            return None
        raise DecodeError(message) from error
    run.counts["pillow"] += 1
    if run.device.type == "cuda":
        pixels = pixels.pin_memory().to(run.device, non_blocking=True)
    return pixels


def _stack(images: list[Any]) -> Any:
    """One tensor when every image has the same shape, else the list."""
    import torch

    if images and all(
        isinstance(image, torch.Tensor) and image.shape == images[0].shape for image in images
    ):
        return torch.stack(images)
    return images
