"""One encoded batch through a device decoder: decode in parts, check, fall back, crop, finish.

Called by :class:`~.gpudecode.GpuDecode` inside its side stream. Images the device decoder
rejects, decodes to another size than the header said, or that end without a JPEG end marker
(truncated) are decoded by Pillow on the CPU; if Pillow fails too, the image is corrupt and
raises (or is skipped and counted), as on the CPU path.

Ordering device work between the decode stream and the training step's stream.

A :class:`~.gpudecode.GpuDecode` enqueues a batch's decode, crops and normalisation on a side
stream of its own, so they can run while the training step of the previous batch still runs
on the current stream. Three rules keep that correct (each is a method here):

1. The training step's stream waits for the batch's *event* before it reads the batch
   (:meth:`CudaOrder.wait`): a device-side wait, the host never blocks.
2. Every tensor handed over is marked as used by the training step's stream
   (:meth:`CudaOrder.hand_over`, ``Tensor.record_stream``), so PyTorch's caching allocator does
   not give its memory to the next decode while the step still reads it (the hazard of
   torchvision PR #9606, where ``decode_jpeg`` wrote into memory the caller's stream still read).
3. Memory the decoder owns (nvImageCodec's images, the encoded bytes it reads) is *retired*
   with the batch's event and released only once the event has completed
   (:class:`Retirements`), never while kernels may still read it.

:class:`HostOrder` follows the same protocol on the CPU, where work is synchronous; it records
each call, so the protocol is tested without a GPU.

GpuDecode: decode, crop and normalise batches on the GPU, in the training process.

``StreamingDataset(..., decode="cuda")`` (or ``decode=GpuDecode(...)``) makes the DataLoader
workers hand over encoded images with their crops and flips already drawn (see
:mod:`.encoded`); :class:`~shardstream.StreamingDataLoader` then decodes each batch
on the GPU before handing it to the training step. A CUDA decoder cannot run in forked
DataLoader workers, so it runs here, after the hand-off, on a stream of its own (see
this module), one batch ahead of the training step."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import itertools
import logging
import threading
import time
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from shardstream._storage.background import BackgroundIterator, ProcessLocal
from shardstream.errors import ConfigError, DecodeError
from shardstream.streaming._decoding import gpubackends
from shardstream.streaming._decoding.encoded import (
    PIXELS,
    EncodedBatch,
    EncodedImage,
    flat_bytes,
)
from shardstream.streaming._decoding.gpubackends import (
    decode_with_pillow,
    empty_batch,
    finish_batch,
    resize_crop_into,
)

__all__ = [
    "CudaOrder",
    "GpuDecode",
    "HostOrder",
    "Retirements",
    "decode_encoded",
    "encoded_arrays",
    "order_for",
    "resolve_gpu_decode",
    "truncated_jpegs",
]


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
        DecodeError: An image is corrupt (``on_error="raise"``).
    """
    rows = np.asarray(batch.params.numpy(), dtype=np.int64).reshape(len(batch), -1)
    stored = rows[:, PIXELS] == 1
    if stored.all() and len(batch):
        return _decode_pixels(run, batch, rows, alive), list(range(len(batch)))
    if stored.any():
        return _decode_mixed(run, batch, stored, alive)
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
    if out is not None and recipe is not None:
        return finish_batch(out[: len(kept)], rows[kept], recipe, run.constants), kept
    return _stack(whole), kept


def _decode_pixels(run: Any, batch: EncodedBatch, rows: np.ndarray, alive: list[Any]) -> Any:
    """A batch of pixel crops (``build --pixels``): staged on the host, moved in one copy, then
    cropped, resized and flipped for the whole batch at once (:func:`.resize_pixels_into`)."""
    for index, image in enumerate(batch.images):
        height, width = int(rows[index, 2]), int(rows[index, 3])
        if image.numel() != height * width * 3:  # a batch made by hand, not by a worker
            raise DecodeError(
                f"{batch.where(index)}: pixel crop of {image.numel()} bytes, expected "
                f"{height} x {width} x 3 = {height * width * 3}; pixel batches are made by "
                "a dataset's workers with decode='cuda'"
            )
    recipe = batch.recipe
    staged = gpubackends.stage_pixels(batch.images, rows, recipe, run.owner.max_images, run.device)
    alive.append(staged.buffer)  # read by the copy until the batch's event
    on_device = gpubackends.to_device(staged.buffer, run.device)
    run.counts["images"] += len(batch)
    run.counts["pixels"] += len(batch)
    if recipe is None:
        images = gpubackends.pixel_images(staged, on_device, rows)
        transform = run.owner.transform
        return _stack([image if transform is None else transform(image) for image in images])
    out = empty_batch(len(batch), recipe, run.device)
    gpubackends.resize_pixels_into(out, staged, on_device)
    unflipped = rows.copy()
    unflipped[:, 4:6] = 0  # folded into the filters
    return finish_batch(out, unflipped, recipe, run.constants)


def _decode_mixed(
    run: Any, batch: EncodedBatch, stored: np.ndarray, alive: list[Any]
) -> tuple[Any, list[int]]:
    """A batch of encoded images and pixel crops (JPEG and pixel shards mixed): each kind
    decoded as a batch of its own, then the images put back in the batch's order."""
    import torch

    kept: list[int] = []
    images: list[Any] = []
    for group in (np.flatnonzero(~stored), np.flatnonzero(stored)):
        part = EncodedBatch(
            [batch.images[i] for i in group],
            batch.params[torch.from_numpy(group)],
            [batch.keys[i] for i in group],
            [batch.urls[i] for i in group],
            batch.recipe,
        )
        decoded, part_kept = decode_encoded(run, part, alive)
        kept += [int(group[i]) for i in part_kept]
        images += list(decoded)
    order = np.argsort(kept, kind="stable").tolist()
    return _stack([images[i] for i in order]), sorted(kept)


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


class CudaOrder:
    """A side stream on one CUDA device and the waits that hand its work over.

    Args:
        device: The CUDA device.
    """

    def __init__(self, device: Any) -> None:
        import torch

        self.device = device
        self.stream = torch.cuda.Stream(device)

    @contextlib.contextmanager
    def side(self) -> Iterator[None]:
        """Enqueue the work of the ``with`` block on the side stream."""
        import torch

        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            yield

    def record(self) -> Any:
        """An event recorded on the side stream after everything enqueued so far."""
        import torch

        event = torch.cuda.Event()
        event.record(self.stream)
        return event

    def wait(self, event: Any) -> None:
        """Make the current stream (the training step's) wait for ``event`` on the device."""
        import torch

        torch.cuda.current_stream(self.device).wait_event(event)

    def hand_over(self, tensor: Any) -> None:
        """Mark ``tensor``, made on the side stream, as used by the current stream."""
        import torch

        tensor.record_stream(torch.cuda.current_stream(self.device))

    def done(self, event: Any) -> bool:
        """Whether the device has finished the work before ``event`` (no waiting)."""
        return bool(event.query())

    def finish(self, event: Any) -> None:
        """Block until the work before ``event`` is done."""
        event.synchronize()


class HostOrder:
    """The same protocol on the CPU: work is done when enqueued. Records every call.

    Attributes:
        log: ``(method, argument)`` pairs in call order, for tests.
    """

    device: Any = None
    stream: Any = None

    def __init__(self) -> None:
        self.log: list[tuple[str, Any]] = []
        self._events = 0
        self._inside = False

    @contextlib.contextmanager
    def side(self) -> Iterator[None]:
        self.log.append(("side", None))
        self._inside = True
        try:
            yield
        finally:
            self._inside = False

    def record(self) -> int:
        self._events += 1
        self.log.append(("record", self._events))
        return self._events

    def wait(self, event: int) -> None:
        self.log.append(("wait", event))

    def hand_over(self, tensor: Any) -> None:
        self.log.append(("hand_over", id(tensor)))

    def done(self, event: int) -> bool:
        return True

    def finish(self, event: int) -> None:
        self.log.append(("finish", event))


def order_for(device: Any) -> CudaOrder | HostOrder:
    """A :class:`CudaOrder` for a CUDA device, a :class:`HostOrder` for the CPU."""
    return CudaOrder(device) if device.type == "cuda" else HostOrder()


class Retirements:
    """Objects kept alive until the device work that reads them has finished.

    Args:
        order: The stream order whose events say when work is done.
    """

    def __init__(self, order: CudaOrder | HostOrder) -> None:
        self.order = order
        self._queue: collections.deque[tuple[Any, list[Any]]] = collections.deque()
        # The stage's thread retires; the training thread may release all (close()).
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            return sum(len(objects) for _, objects in self._queue)

    def retire(self, event: Any, objects: list[Any]) -> None:
        """Keep ``objects`` until ``event`` completes, then release them."""
        with self._lock:
            self._queue.append((event, objects))
        self.release_done()

    def release_done(self) -> None:
        """Release the objects of every completed event, oldest first."""
        with self._lock:
            while self._queue and self.order.done(self._queue[0][0]):
                self._queue.popleft()

    def release_all(self) -> None:
        """Wait for every pending event, then release everything."""
        with self._lock:
            while self._queue:
                event, _ = self._queue.popleft()
                self.order.finish(event)


@dataclasses.dataclass(frozen=True)
class GpuDecode:
    """Decodes encoded batches on a GPU: decode, ``RandomResizedCrop``, flips, ``Normalize``.

    Give it to a dataset as ``decode`` (``decode="cuda"`` is ``GpuDecode()``): workers then read
    the image sizes from the headers and draw each crop and flip with the transform's own
    parameters, on the same RNG and in the same order as the CPU path, and hand over the encoded
    bytes. :class:`~shardstream.StreamingDataLoader` finishes each batch here; with
    another loader, call ``ds.gpu_decode(batch)`` on each batch.

    The transform is recognised as on the CPU fast path: a v2 ``Compose`` starting with bilinear
    antialiased ``RandomResizedCrop``, then flips, ``ToImage``/``PILToTensor``, ``ToDtype`` to
    float and ``Normalize``. Any other transform runs per image on the decoded GPU tensor (its
    random draws then come from the training process); no transform yields each whole image.

    Images that the device decoder rejects, and JPEGs without an end marker (truncated), are
    decoded by Pillow on the CPU, whose verdict decides: a corrupt image raises a
    ``DecodeError`` naming shard and key, or with ``on_error="skip"`` is left out of its batch
    (the batch is shorter; labels follow) and counted in :meth:`stats`.

    Pixel members (``build --pixels``) are not decoded: the workers hand over each drawn crop's
    pixels, and a batch of them moves in one copy and is resized as one (see
    :func:`~.gpubackends.resize_pixels_into`).

    Without CUDA, a dataset given ``decode="cuda"`` decodes on the CPU in its DataLoader workers
    instead (logged once), so the same code runs anywhere. ``device="cpu"`` runs this stage on
    the CPU (for tests and comparison).

    Attributes:
        device: ``"cuda"`` (the current CUDA device when a batch is decoded), ``"cuda:N"`` or
            ``"cpu"``.
        backend: ``"auto"`` (nvImageCodec when installed with nvJPEG, else torchvision's
            nvJPEG decoder), ``"nvimgcodec"``, ``"torchvision"`` or ``"cpu"``.
        on_error: ``"raise"`` or ``"skip"``; None takes the dataset's.
        max_images: Images decoded per decoder call: bounds the device memory of decoded,
            not yet resized images (a batch is decoded in parts of this many).
        num_threads: Host threads the decoder may use (None: 2).
        transform: Set by the dataset: its transform.
        ahead: Batches decoded ahead of the training step, on a thread of the stage's own
            (its decoder calls release the GIL), so the training thread only queues its own
            kernels and waits for a finished batch on the device. 0 decodes on the training
            thread, one batch ahead.

    Examples:
        >>> ds = StreamingDataset("shards/train", batch_size=256, transform=train_transform,
        ...                       decode="cuda")  # doctest: +SKIP
        >>> for images, labels in StreamingDataLoader(ds, num_workers=2):  # doctest: +SKIP
        ...     loss = model(images).cross_entropy(labels)  # images: float32 on the GPU
    """

    device: str = "cuda"
    backend: str = "auto"
    on_error: str | None = None
    max_images: int = 128
    num_threads: int | None = None
    transform: Any = None
    ahead: int = 2

    def __post_init__(self) -> None:
        if self.backend not in gpubackends.BACKENDS:
            raise ConfigError(
                f"GpuDecode backend must be one of {gpubackends.BACKENDS}, got {self.backend!r}"
            )
        if self.on_error not in (None, "raise", "skip"):
            raise ConfigError(f"on_error must be 'raise' or 'skip', got {self.on_error!r}")
        if self.max_images < 1:
            raise ConfigError(f"max_images must be at least 1, got {self.max_images}")
        if self.ahead < 0:
            raise ConfigError(f"ahead must be 0 or more batches, got {self.ahead}")
        if not str(self.device).startswith(("cuda", "cpu")):
            raise ConfigError(
                f"GpuDecode decodes on 'cuda', 'cuda:N' or 'cpu', not {self.device!r}"
            )

    def runs_here(self) -> bool:
        """Whether this machine has the device (CUDA available, or ``"cpu"``)."""
        import torch

        return str(self.device).startswith("cpu") or torch.cuda.is_available()

    def __call__(self, batch: Any) -> Any:
        """Decode one batch (or single sample) as the loader hands it over; waits for nothing.

        The result lives on the device; the current stream waits for it on the device, so it
        can be used at once. Anything not encoded (a CPU-decoded batch) is returned unchanged.
        """
        return self._run().submit(batch).result()

    def batches(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Decode ``batches`` ahead of the training step, handing them out in order.

        With ``ahead`` > 0, a thread of the stage pulls batches ``k + 1 .. k + ahead`` from
        ``batches`` and enqueues their device work on the stage's stream while batch ``k``
        trains; the calling thread only makes its stream wait for a finished batch's event.
        With ``ahead=0``, batch ``k + 1`` is enqueued on the calling thread before ``k`` is
        handed out. Either way a batch that fails to decode raises here, after every batch
        before it was handed out, and stopping early (``break``, an exception in the loop)
        stops the thread before this generator returns.
        """
        run = self._run()  # on the calling thread: its current CUDA device is the one used
        if self.ahead == 0:
            yield from _one_ahead(run.submit(batch) for batch in batches)
            return
        submitted = BackgroundIterator(
            lambda: (run.submit(batch) for batch in batches),
            depth=self.ahead,
            name="shardstream-gpu-decode",
        )
        try:  # the thread keeps the device ahead: hand each batch out at once
            for pending in submitted:
                if (value := pending.result()) is not None:
                    yield value  # None: a single sample skipped as corrupt
        finally:  # a batch being made is finished first; a stuck source is not waited on
            submitted.close(timeout_s=_STOP_WAIT_S)

    def stats(self) -> dict[str, Any]:
        """This process's counts: ``batches``, ``images`` decoded, ``pixels`` (of them, crops
        of pixel members, not decoded), ``pillow`` (decoded on the CPU after the device
        decoder rejected them), ``skipped``, ``host_s`` (host time spent
        enqueuing), and the ``backend`` used."""
        run = self._runs().peek()
        counts = dict(_ZERO_COUNTS) if run is None else dict(run.counts)
        counts["backend"] = None if run is None else run.backend.name
        return counts

    def close(self) -> None:
        """Wait for enqueued device work and release the decoder's memory (idempotent)."""
        run = self._runs().peek()
        if run is not None:
            run.retired.release_all()

    def _run(self) -> _DeviceRun:
        return self._runs().get()

    def _runs(self) -> ProcessLocal[_DeviceRun]:
        # Streams and decoders are per process and not picklable: kept beside the frozen,
        # picklable configuration, made on first use in each process.
        runs = self.__dict__.get("_device_runs")
        if runs is None:
            runs = ProcessLocal(functools.partial(_DeviceRun, self))
            object.__setattr__(self, "_device_runs", runs)
        return runs

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "_device_runs"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)


#: Longest wait for the stage's thread when the loop stops early.
_STOP_WAIT_S = 30.0

_ZERO_COUNTS: dict[str, Any] = {
    "batches": 0,
    "images": 0,
    "pixels": 0,
    "pillow": 0,
    "skipped": 0,
    "host_s": 0.0,
}


def resolve_gpu_decode(decode: Any, transform: Any, on_error: str) -> tuple[Any, GpuDecode | None]:
    """``(what workers do, the stage that finishes batches)`` for a dataset's ``decode``.

    ``"cuda"`` and :class:`GpuDecode` give ``(stage, stage)`` on a machine with the device;
    without it, ``("rgb8", None)`` (the CPU path in the workers), logged once. Anything else is
    returned as is, with no stage.
    """
    if isinstance(decode, str) and decode.startswith("cuda"):
        decode = GpuDecode(device=decode)
    if not isinstance(decode, GpuDecode):
        return decode, None
    if not decode.runs_here():
        logger.warning(
            "decode=%r: no CUDA device here, so images decode on the CPU in the DataLoader "
            "workers (the same transform and random draws)",
            decode.device,
        )
        return "rgb8", None
    stage = dataclasses.replace(decode, transform=transform, on_error=decode.on_error or on_error)
    return stage, stage


class _Pending:
    """A batch whose device work is enqueued: :meth:`result` hands it to the current stream."""

    def __init__(self, order: Any, value: Any, tensors: list[Any], event: Any) -> None:
        self.order, self.value, self.tensors, self.event = order, value, tensors, event

    def result(self) -> Any:
        if self.event is not None:
            self.order.wait(self.event)
            for tensor in self.tensors:
                self.order.hand_over(tensor)
        return self.value


class _DeviceRun:
    """One process's decoder, stream order and counters for one :class:`GpuDecode`."""

    def __init__(self, owner: GpuDecode) -> None:
        import torch

        self.owner = owner
        device = torch.device(owner.device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        self.device = device
        threads = owner.num_threads or gpubackends.default_threads()
        self.backend = gpubackends.make_backend(owner.backend, device, threads)
        self.order = order_for(device)
        self.retired = Retirements(self.order)
        self.constants: dict[Any, Any] = {}
        self.counts: dict[str, Any] = dict(_ZERO_COUNTS)

    def submit(self, batch: Any) -> _Pending:
        """Enqueue the device work of one batch (or sample) as the loader hands it over."""
        if isinstance(batch, (tuple, list)) and batch and _is_encoded(batch[0]):
            parts = list(batch)
        elif isinstance(batch, dict) and _is_encoded(batch.get("image")):
            parts = [batch["image"], *(value for key, value in batch.items() if key != "image")]
        elif _is_encoded(batch):
            parts = [batch]
        else:
            return _Pending(self.order, batch, [], None)  # decoded on the CPU already
        started = time.perf_counter()
        encoded = _as_batch(parts[0])
        alive: list[Any] = [parts[0]]  # read by enqueued work: kept until its event completes
        try:
            with self.order.side():
                images, kept = decode_encoded(self, encoded, alive)
                if not kept and len(encoded) > 1:
                    raise DecodeError(
                        f"all {len(encoded)} images of one batch failed to decode (see the log); "
                        "an empty batch cannot be collated. Check the shards with "
                        "`shardstream verify`."
                    )
                rest = [self._cut(part, kept, len(encoded)) for part in parts[1:]]
        finally:  # also when a corrupt image raises halfway: earlier parts are enqueued
            with self.order.side():
                event = self.order.record()
            self.retired.retire(event, alive)
        if isinstance(parts[0], EncodedImage):
            images = images[0] if kept else None  # None: a skipped single sample
        else:
            self.counts["batches"] += 1
        self.counts["host_s"] += time.perf_counter() - started
        tensors = _tensors_in([images, *rest])
        if isinstance(batch, dict):
            value: Any = dict(zip([k for k in batch if k != "image"], rest, strict=True))
            value["image"] = images
        elif isinstance(batch, (tuple, list)):
            value = type(batch)([images, *rest])
        else:
            value = images
        return _Pending(self.order, value, tensors, event)

    def _cut(self, part: Any, kept: list[int], count: int) -> Any:
        """A batch's other field cut to the kept images: a per-image tensor (labels) is also
        moved to the device, a per-image list (keys) cut; anything else is left as it is."""
        import torch

        if isinstance(part, list) and len(part) == count:
            return part if len(kept) == count else [part[i] for i in kept]
        if not isinstance(part, torch.Tensor) or part.dim() == 0 or len(part) != count:
            return part
        if len(kept) != count:
            part = part[torch.as_tensor(kept, dtype=torch.int64)]
        if self.device.type == "cuda":
            part = part.pin_memory().to(self.device, non_blocking=True)
        return part


def _one_ahead(pending: Iterator[_Pending]) -> Iterator[Any]:
    """Each batch handed to the current stream after the next one was submitted (the device
    decodes it while this one trains); a failure to submit raises after the batch before it."""
    previous = None
    for following in pending:
        if previous is not None and (value := previous.result()) is not None:
            yield value  # None: a single sample skipped as corrupt
        previous = following
    if previous is not None and (value := previous.result()) is not None:
        yield value


def _is_encoded(value: Any) -> bool:
    return isinstance(value, (EncodedBatch, EncodedImage))


def _tensors_in(values: list[Any]) -> list[Any]:
    """The tensors among ``values`` and in lists of them (a batch of differently sized images)."""
    import torch

    found = []
    for value in values:
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, torch.Tensor):
                found.append(item)
    return found


def _as_batch(encoded: Any) -> EncodedBatch:
    """An :class:`EncodedBatch` of one :class:`EncodedImage` (unbatched datasets)."""
    if isinstance(encoded, EncodedBatch):
        return encoded
    import torch

    data = encoded.data
    if not isinstance(data, torch.Tensor):
        data = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    params = torch.tensor([encoded.params], dtype=torch.int32)
    return EncodedBatch([data], params, [encoded.key], [encoded.url], encoded.recipe)
