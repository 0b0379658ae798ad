"""Collating samples into batches inside the DataLoader workers, into shared memory.

One batch crosses the worker queue as one pickle holding one shared-memory tensor for the images,
instead of one pickle per sample or pickled image bytes:

- decoded images of equal shape are stacked straight into a shared-memory tensor (as
  ``default_collate`` does in workers), so the training process copies nothing; crops whose
  dtype conversion and ``Normalize`` are still pending (:class:`~.fastcrop.PendingImage`) are
  finished as they are written there, without a float image per sample;
- raw (undecoded) images are packed into ONE flat ``uint8`` shared-memory tensor and handed out
  as a list of 1-D ``uint8`` views into it (:class:`ByteViews`): the storage crosses the queue
  once and each view carries only offsets. The views feed GPU JPEG decoders (TorchCodec's
  ``decode_jpeg(view, device="cuda")``) directly; ``bytes(view.numpy())`` gives the original
  bytes back.

In workers, that shared memory is a small set of buffers each worker reuses once the training
process has freed a batch (:mod:`shardstream.streaming._worker.shmpool`), not a new segment per
batch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np

from shardstream._storage.backends.localmaps import lost_bytes
from shardstream.streaming._decoding.encoded import EncodedBatch, EncodedImage
from shardstream.streaming._decoding.fastcrop import PendingImage, writable_bytes
from shardstream.streaming._worker import shmpool
from shardstream.streaming._worker.shmpool import inline

DEFAULT_BUFFERS = 6  # per worker: queued batches (prefetch 2), one in use, one being pinned

__all__ = [
    "ByteViews",
    "WrappedViews",
    "collate_dicts",
    "collate_encoded",
    "collate_pairs",
    "lost_in",
    "pack_bytes",
    "stack_or_list",
]


class ByteViews(list):
    """A list of 1-D ``uint8`` tensor views into one flat buffer; pickles as buffer + offsets.

    Unpickled (e.g. in the training process) it becomes a plain ``list`` of views again.
    """

    def __init__(self, buffer: Any, bounds: Sequence[int]) -> None:
        super().__init__(_unpack(buffer, bounds))
        self.buffer, self.bounds = buffer, tuple(bounds)

    def __reduce__(self) -> tuple[Any, ...]:
        return _unpack, (self.buffer, self.bounds)

    def __copy__(self) -> ByteViews:  # shallow, as for a list: the same views (default_convert)
        copied = ByteViews.__new__(ByteViews)
        copied.extend(self)
        copied.buffer, copied.bounds = self.buffer, self.bounds
        return copied


class WrappedViews(list):
    """1-D ``uint8`` tensors that wrap the reader's buffers as they are (no copy), and those
    buffers (``blobs``): memory-mapped shard bytes a loader checks before handing the batch
    out (:func:`lost_in`). Pickled or pinned, it becomes a plain ``list`` of tensors."""

    def __init__(self, tensors: Iterable[Any] = (), blobs: Sequence[Any] = ()) -> None:
        super().__init__(tensors)
        self.blobs = blobs

    def __reduce__(self) -> tuple[Any, ...]:
        return list, (list(self),)


def lost_in(batch: Any) -> str | None:
    """What a batch's wrapped views lost when a memory-mapped shard file they view was cut
    since the batch was made (touching them would kill the process with SIGBUS), else None.

    Looks at the batch itself, its tuple items and its dict values: where collation puts
    images (encoded ones too). One ``fstat`` per image's map.
    """
    if isinstance(batch, dict):
        fields: Iterable[Any] = batch.values()
    elif isinstance(batch, (list, tuple)):
        fields = batch if not isinstance(batch, WrappedViews) else (batch,)
    else:
        fields = (batch,)
    for field in fields:
        if isinstance(field, EncodedBatch):
            field = field.images
        if isinstance(field, WrappedViews):
            lost = lost_bytes(field.blobs)
            if lost is not None:
                return lost
    return None


def _unpack(buffer: Any, bounds: Sequence[int]) -> list[Any]:
    """The views: one C call (``split``) rather than a slice per blob."""
    sizes = [stop - start for start, stop in itertools.pairwise(bounds)]
    return list(buffer[bounds[0] : bounds[-1]].split(sizes)) if sizes else []


def pack_bytes(
    blobs: Sequence[bytes], shared: bool = False, buffers: int = DEFAULT_BUFFERS
) -> list[Any]:
    """Copy ``blobs`` into one flat ``uint8`` tensor and return views into it, one per blob.

    Outside a worker, non-empty writable blobs (the shard reader's ``memoryview`` slices, or
    ``bytearray``) are wrapped as tensors as they are, without the copy; the result is then a
    list (:class:`WrappedViews`, which keeps the blobs to check).

    Args:
        blobs: Encoded images (any bytes-like objects).
        shared: Put the buffer in shared memory (inside DataLoader workers: the caller knows
            where it runs, from :class:`~shardstream.streaming._control.context.Context`).
        buffers: Reusable shared-memory buffers a worker keeps (0: a new segment per batch).

    Examples:
        >>> [bytes(view.numpy()) for view in pack_bytes([b"ab", b"", b"c"], shared=False)]
        [b'ab', b'', b'c']
    """
    import torch

    if not shared and all(writable_bytes(blob) for blob in blobs):
        # Nothing crosses a process: wrap the reader's own buffers, no copy.
        return WrappedViews([torch.frombuffer(blob, dtype=torch.uint8) for blob in blobs], blobs)
    bounds = [0, *np.cumsum([len(blob) for blob in blobs]).tolist()]
    buffer = shmpool.empty((bounds[-1],), torch.uint8, buffers, shared)
    flat = memoryview(cast(Any, buffer.numpy()))
    for blob, (start, stop) in zip(blobs, itertools.pairwise(bounds), strict=True):
        flat[start:stop] = blob
    return ByteViews(buffer, bounds)


def stack_or_list(
    values: Sequence[Any], pack: bool = False, buffers: int = DEFAULT_BUFFERS, shared: bool = False
) -> Any:
    """Stack tensors of equal shape into one tensor (shared memory if ``shared``); else a list.

    With ``pack``, bytes (raw images) become :class:`ByteViews` over one flat buffer.
    ``buffers`` and ``shared`` are as in :func:`pack_bytes`. :class:`~.fastcrop.PendingImage`
    values are finished into the stacked tensor's rows, or one by one for a list.
    """
    import torch

    if any(isinstance(value, PendingImage) for value in values):
        return _stack_pending(values, buffers, shared)
    first = values[0] if values else None
    if pack and isinstance(first, EncodedImage):
        return collate_encoded(values, buffers, shared)
    if (
        pack
        and isinstance(first, (bytes, bytearray, memoryview))
        and all(isinstance(v, (bytes, bytearray, memoryview)) for v in values)
    ):
        return pack_bytes(values, shared, buffers)
    if isinstance(first, torch.Tensor) and all(
        isinstance(v, torch.Tensor) and v.shape == first.shape for v in values
    ):
        # In workers, stack into shared memory: the training process then copies nothing.
        out = shmpool.empty((len(values), *first.shape), first.dtype, buffers, shared)
        return torch.stack(list(values), out=out)
    return list(values)


def _stack_pending(values: Sequence[Any], buffers: int, shared: bool) -> Any:
    """Pending crops of one shape and dtype, each finished straight into its row of the batch."""
    first = values[0]
    if all(
        isinstance(value, PendingImage)
        and value.shape == first.shape
        and value.dtype == first.dtype
        for value in values
    ):
        out = shmpool.empty((len(values), *first.shape), first.dtype, buffers, shared)
        for value, row in zip(values, out, strict=True):
            value.write(row)
        return out
    finished = [value.finish() if isinstance(value, PendingImage) else value for value in values]
    return stack_or_list(finished, False, buffers, shared)


def collate_encoded(
    values: Sequence[EncodedImage], buffers: int = DEFAULT_BUFFERS, shared: bool = False
) -> EncodedBatch:
    """Encoded images (``decode="cuda"``) -> one :class:`~.encoded.EncodedBatch`: the bytes
    packed into one flat buffer as for raw batches, the drawn parameters as one small table."""
    import torch

    params = torch.tensor([value.params for value in values], dtype=torch.int32)
    return EncodedBatch(
        images=pack_bytes([value.data for value in values], shared, buffers),
        params=inline(params) if shared else params,
        keys=[value.key for value in values],
        urls=[value.url for value in values],
        recipe=values[0].recipe,
    )


def collate_pairs(
    pairs: Sequence[tuple[Any, ...]], buffers: int = DEFAULT_BUFFERS, shared: bool = False
) -> tuple[Any, ...]:
    """``[(image, label), ...]`` -> ``(images, labels)`` with ``labels`` an int64 tensor.

    Samples of ``policy="mask"``, ``(image, label, valid)``, give ``(images, labels, valid)``
    with ``valid`` a bool tensor. ``shared``: in a DataLoader worker (images to shared memory,
    small tensors inlined).

    Examples:
        >>> _, labels, valid = collate_pairs([(b"a", 1, True), (b"b", 2, False)])
        >>> labels.tolist(), valid.tolist()
        ([1, 2], [True, False])
    """
    images = stack_or_list([pair[0] for pair in pairs], True, buffers, shared)
    labels = _small_tensor([pair[1] for pair in pairs], "int64", shared)
    if pairs and len(pairs[0]) == 3:
        return images, labels, _small_tensor([pair[2] for pair in pairs], "bool", shared)
    return images, labels


def _small_tensor(values: Sequence[Any], dtype: str, shared: bool) -> Any:
    """Labels or validity marks as one tensor (inlined into the pickle in a worker)."""
    import torch

    tensor = torch.tensor(values, dtype=getattr(torch, dtype))
    return inline(tensor) if shared else tensor


#: Fields of a sample dict collated into one small tensor, with its dtype.
_TENSOR_FIELDS = {"label": "int64", "__valid__": "bool"}


def collate_dicts(
    samples: Sequence[dict[str, Any]], buffers: int = DEFAULT_BUFFERS, shared: bool = False
) -> dict[str, Any]:
    """List of sample dicts -> dict of batched fields (``label`` a tensor, images stacked).

    Raw ``image`` bytes become :class:`ByteViews`; other bytes fields stay lists of bytes;
    ``__valid__`` (``policy="mask"``) becomes a bool tensor. ``shared`` is as in
    :func:`collate_pairs`.
    """
    keys = list(samples[0]) if samples else []
    batch: dict[str, Any] = {}
    for key in keys:
        values = [sample.get(key) for sample in samples]
        if key in _TENSOR_FIELDS:
            batch[key] = _small_tensor(values, _TENSOR_FIELDS[key], shared)
        else:
            batch[key] = stack_or_list(values, key == "image", buffers, shared)
    return batch
