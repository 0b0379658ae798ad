"""Decoding many encoded images at once on a device: nvImageCodec, torchvision, or the CPU.

Each backend takes a list of encoded images (1-D ``uint8`` arrays on the host) and returns,
per image, a ``uint8`` RGB tensor of shape ``(3, H, W)`` on its device (possibly a strided
view of an ``(H, W, 3)`` buffer), or None where it could not decode that image. The caller
(:mod:`.gpudecode`) decodes those again on the CPU with Pillow, which decides whether the image
is corrupt, so a batch never fails as a whole.

- :class:`NvImageCodecBackend`: nvImageCodec's batched decoder (nvJPEG; the hardware JPEG
  decoder on A100/H100/B200 where present), with libjpeg-turbo's "fancy" chroma upsampling so
  pixels stay close to the CPU path's. Needs ``nvidia-nvimgcodec-cu13`` and ``nvidia-nvjpeg``
  (``pip install "shardstream[gpu]"``).
- :class:`TorchvisionBackend`: ``torchvision.io.decode_jpeg(list, device="cuda")`` (batched
  nvJPEG), which raises for the whole batch on one corrupt image: then images are decoded one
  by one.
- :class:`HostBackend`: the CPU (libjpeg-turbo through torchvision, Pillow for other formats),
  for ``GpuDecode(device="cpu")`` and tests.

Crop, resize, flip and normalise decoded images on their device, as the CPU path does.

:func:`resize_crop_into` crops one decoded image by its drawn box and resizes it with the
antialiased bilinear filter of ``RandomResizedCrop`` (torch's ``interpolate(...,
antialias=True)``, the filter Pillow and torchvision use) into one slot of the batch.
:func:`finish_batch` then rounds to whole ``uint8`` levels (the CPU path resizes ``uint8``
tensors), applies the drawn flips, and the recipe's ``ToDtype``/``Normalize`` affine map, in a
few batched operations. Per image the device sees a cast and one resize; the rest is per batch."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import io
import os
import sys
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from shardstream.errors import ConfigError
from shardstream.streaming._decoding.encoded import CropRecipe, flat_bytes

__all__ = [
    "BACKENDS",
    "HostBackend",
    "NvImageCodecBackend",
    "TorchvisionBackend",
    "decode_with_pillow",
    "StagedPixels",
    "empty_batch",
    "filter_taps",
    "finish_batch",
    "make_backend",
    "pixel_images",
    "resize_crop_into",
    "resize_pixels_into",
    "stage_pixels",
    "to_device",
    "to_device_index",
]


BACKENDS = ("auto", "nvimgcodec", "torchvision", "cpu")

_JPEG_MAGIC = b"\xff\xd8"


def is_jpeg(blob: Any) -> bool:
    """True when the bytes (a ``uint8`` array) start like a JPEG stream."""
    return len(blob) >= 2 and bytes(blob[:2]) == _JPEG_MAGIC


def decode_with_pillow(blob: Any) -> Any:
    """Decode any image Pillow reads into a ``uint8`` RGB ``(3, H, W)`` CPU tensor.

    Raises:
        Exception: Pillow's error for a corrupt or truncated image.
    """
    import numpy as np
    import torch
    from PIL import Image

    with Image.open(io.BytesIO(memoryview(blob))) as image:
        rgb = np.asarray(image.convert("RGB"))
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1)


@contextlib.contextmanager
def _no_deprecation() -> Iterator[None]:
    """torchvision 0.29 deprecates its image decoders; the warning is not the user's."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="The image decoding and encoding capabilities of TorchVision are deprecated",
            category=DeprecationWarning,
        )
        yield


class HostBackend:
    """Decodes on the CPU: JPEGs with libjpeg-turbo (torchvision), others with Pillow."""

    name = "cpu"
    device = "cpu"

    def decode(self, blobs: Sequence[Any], stream: Any = None) -> list[Any]:
        """One ``(3, H, W)`` ``uint8`` tensor per blob, or None where it does not decode."""
        del stream
        import torch
        from torchvision import io as tvio

        decoded: list[Any] = []
        for blob in blobs:
            try:
                if is_jpeg(blob):
                    data = torch.from_numpy(blob)
                    with _no_deprecation():
                        decoded.append(tvio.decode_jpeg(data, mode=tvio.ImageReadMode.RGB))
                else:
                    decoded.append(decode_with_pillow(blob))
            except Exception:  # the caller asks Pillow, which names the problem
                decoded.append(None)
        return decoded

    def keepalive(self) -> list[Any]:
        """Objects that own decoded memory until the device is done with it (none here)."""
        return []


class TorchvisionBackend:
    """Batched nvJPEG through ``torchvision.io.decode_jpeg(list, device=...)``.

    Args:
        device: A CUDA device.
    """

    name = "torchvision"

    def __init__(self, device: Any) -> None:
        self.device = device

    def decode(self, blobs: Sequence[Any], stream: Any = None) -> list[Any]:
        """Decode the JPEGs of ``blobs`` in one call; one by one if that call raises."""
        import torch
        from torchvision import io as tvio

        del stream  # torchvision decodes on the current stream, which the caller has set
        decoded: list[Any] = [None] * len(blobs)
        jpegs = [i for i, blob in enumerate(blobs) if is_jpeg(blob)]
        data = {i: torch.from_numpy(blobs[i]) for i in jpegs}
        mode = tvio.ImageReadMode.RGB
        with _no_deprecation():
            try:
                images = tvio.decode_jpeg([data[i] for i in jpegs], mode=mode, device=self.device)
                for i, image in zip(jpegs, images, strict=True):
                    decoded[i] = image
            except RuntimeError:  # one corrupt image fails the whole call
                for i in jpegs:
                    with contextlib.suppress(RuntimeError):
                        decoded[i] = tvio.decode_jpeg(data[i], mode=mode, device=self.device)
        return decoded

    def keepalive(self) -> list[Any]:
        return []


class NvImageCodecBackend:
    """nvImageCodec's batched GPU decoder on one device.

    Args:
        module: The imported ``nvidia.nvimgcodec``.
        device_index: The CUDA device's index.
        num_threads: Host threads nvImageCodec may use (parsing, hybrid Huffman decoding).
    """

    name = "nvimgcodec"

    def __init__(self, module: Any, device_index: int, num_threads: int) -> None:
        import torch

        self.module, self.device_index, self.num_threads = module, device_index, num_threads
        self.device = torch.device("cuda", device_index)
        # The hardware JPEG decoder alone: in one decoder with the hybrid backend, batches went
        # to the hybrid one (measured 1.5 CPU ms per image on an H100, 0.06 with hardware only).
        self.decoder = self._decoder(module.BackendKind.HW_GPU_ONLY)
        self._hybrid: Any = False  # no fallback while checking the hardware decoder alone
        # Pillow and torchvision ignore EXIF orientation and ICC profiles; so does this.
        self.params = module.DecodeParams(
            apply_exif_orientation=False,
            color_spec=module.ColorSpec.SRGB,
            sample_format=module.SampleFormat.I_RGB,
        )
        self._alive: list[Any] = []
        if self.decode([_tiny_jpeg()])[0] is None:  # no hardware decoder, or nvJPEG missing
            raise RuntimeError("nvImageCodec has no hardware JPEG decoder on this device")
        self._alive.clear()
        self._hybrid = None  # made on the first image the hardware decoder rejects

    def _decoder(self, kind: Any) -> Any:
        module = self.module
        return module.Decoder(
            device_id=self.device_index,
            max_num_cpu_threads=self.num_threads,
            backends=[module.Backend(kind)],
            options=":fancy_upsampling=1",  # libjpeg-turbo's chroma upsampling, as on the CPU
        )

    def decode(self, blobs: Sequence[Any], stream: Any = None) -> list[Any]:
        """Decode ``blobs`` in one call, ordered on ``stream`` (a ``torch.cuda.Stream``)."""
        import torch

        module = self.module
        streams = [module.CodeStream(blob) for blob in blobs]
        handle = 0 if stream is None else int(stream.cuda_stream)
        images = self.decoder.decode(streams, params=self.params, cuda_stream=handle)
        rejected = [i for i, image in enumerate(images) if image is None]
        hybrid = self._hybrid
        if rejected and hybrid is not False:
            # Streams the hardware decoder does not take (progressive, 4:1:1...): the hybrid one.
            if hybrid is None:
                hybrid = self._hybrid = self._decoder(module.BackendKind.HYBRID_CPU_GPU)
            again = hybrid.decode(
                [streams[i] for i in rejected], params=self.params, cuda_stream=handle
            )
            for i, image in zip(rejected, again, strict=True):
                images[i] = image
        decoded: list[Any] = []
        for image in images:
            if image is None:
                decoded.append(None)
                continue
            self._alive.append(image)  # owns the pixels until the device has read them
            pixels = torch.as_tensor(image, device=self.device)
            decoded.append(pixels.permute(2, 0, 1) if pixels.dim() == 3 else None)
        return decoded

    def keepalive(self) -> list[Any]:
        """The decoded images' owners since the last call (released by the caller later)."""
        alive, self._alive = self._alive, []
        return alive


def _tiny_jpeg() -> Any:
    """A 16x16 JPEG as a 1-D ``uint8`` array, to check that a decoder works."""
    import numpy as np
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (16, 16), (200, 40, 90)).save(buffer, format="JPEG")
    return np.frombuffer(buffer.getvalue(), dtype=np.uint8)


def make_backend(kind: str, device: Any, num_threads: int) -> Any:
    """The backend ``kind`` (one of :data:`BACKENDS`) for ``device``.

    ``"auto"`` takes nvImageCodec when it loads with nvJPEG, else torchvision's nvJPEG decoder,
    on CUDA devices; the CPU backend on the CPU.

    Raises:
        ConfigError: ``kind`` is unknown, or does not load on this device (names the package).
    """
    if kind not in BACKENDS:
        raise ConfigError(f"GpuDecode backend must be one of {BACKENDS}, got {kind!r}")
    if device.type == "cpu" or kind == "cpu":
        if device.type != "cpu":
            raise ConfigError(f"GpuDecode(backend='cpu') decodes on the CPU, not on {device}")
        return HostBackend()
    if kind in ("auto", "nvimgcodec"):
        try:
            return NvImageCodecBackend(_nvimgcodec(), device.index or 0, num_threads)
        except Exception as error:
            if kind == "nvimgcodec":
                raise ConfigError(
                    f"nvImageCodec does not decode on {device}: {error}. Install it with "
                    '`pip install "shardstream[gpu]"` (nvidia-nvimgcodec-cu13 and nvidia-nvjpeg).'
                ) from error
    return TorchvisionBackend(device)


def _nvimgcodec() -> Any:
    """``nvidia.nvimgcodec``, imported with its loader's messages silenced."""
    from shardstream.streaming._decoding import fastcrop as jpegcrop

    if "nvidia.nvimgcodec" not in sys.modules:
        with jpegcrop.quiet_import():
            importlib.import_module("nvidia.nvimgcodec")
    return importlib.import_module("nvidia.nvimgcodec")


def default_threads() -> int:
    """Host threads for a device decoder: 2, or 1 on a single-core machine."""
    return max(1, min(2, os.cpu_count() or 1))


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


# -- pixel crops (``build --pixels``): one copy to the device, a few kernels per batch ----------

#: Sections of a staging buffer start at multiples of this (so they view as int64/float64).
_ALIGN = 8


@dataclasses.dataclass
class StagedPixels:
    """A batch of pixel crops in one host buffer, for one copy to the device.

    Attributes:
        buffer: ``uint8``: each part's filter tables (aligned sections), then every crop's
            pixels back to back, then one widest line of zeros (the last lines' reads).
        parts: ``(start, stop, max_height, max_width)``: crops resized together.
        sections: ``(byte offset, dtype, shape)`` of each part's five tables, in order.
        pixels_at: Where the pixels start in ``buffer``.
    """

    buffer: Any
    parts: list[tuple[int, int, int, int]]
    sections: list[tuple[int, Any, tuple[int, ...]]]
    pixels_at: int


def stage_pixels(
    crops: Sequence[Any], rows: np.ndarray, recipe: CropRecipe | None, max_images: int, device: Any
) -> StagedPixels:
    """Pack a batch of pixel crops and their resize filters into one staging buffer.

    Per part of ``max_images`` crops: each output row's and column's taps of the antialiased
    bilinear filter (computed in float64 as torch's ``interpolate(..., antialias=True)``
    computes them, the drawn flips folded in by reversing the output order) and the byte
    offset of every crop line (:func:`resize_pixels_into` reads them). Without a recipe only
    the pixels are staged (whole images). Page-locked for a CUDA ``device``, so the copy does
    not wait for the host.

    Args:
        crops: Each crop's pixels, 1-D ``uint8`` tensors (``height x width x 3``, C order).
        rows: Their parameter rows (:data:`~.encoded.PARAM_COLUMNS`).
        recipe: The output size and dtype, or None.
        max_images: Crops resized together (bounds a part's device memory).
        device: Where the buffer is copied to.
    """
    import torch

    sides = rows[:, 2:4].astype(np.int64)
    offsets = np.concatenate([[0], np.cumsum(sides[:, 0] * sides[:, 1] * 3)])
    tables: list[np.ndarray] = []
    parts = []
    for start in range(0, len(rows) if recipe is not None else 0, max_images):
        stop = min(len(rows), start + max_images)
        tables += _part_tables(rows[start:stop], offsets[start:stop], recipe)
        parts.append(
            (start, stop, int(sides[start:stop, 0].max()), int(sides[start:stop, 1].max()))
        )
    sections, at = [], 0
    for table in tables:
        sections.append((at, table.dtype, tuple(table.shape)))
        at += -(-table.nbytes // _ALIGN) * _ALIGN
    pixel_bytes = int(offsets[-1])
    slack = 3 * max((part[3] for part in parts), default=0)
    size = at + pixel_bytes + slack
    buffer = torch.empty(size, dtype=torch.uint8, pin_memory=device.type == "cuda")
    host = buffer.numpy()
    for (offset, _, _), table in zip(sections, tables, strict=True):
        host[offset : offset + table.nbytes] = table.reshape(-1).view(np.uint8)
    buffer[at : at + pixel_bytes].copy_(flat_bytes(crops)[0])  # one copy of packed crops
    host[at + pixel_bytes :] = 0
    return StagedPixels(buffer, parts, sections, at)


def _part_tables(rows: np.ndarray, offsets: np.ndarray, recipe: Any) -> list[np.ndarray]:
    """One part's line offsets, then the taps (index, weights) of its rows, then columns."""
    heights, widths = rows[:, 2].astype(np.int64), rows[:, 3].astype(np.int64)
    high, wide = int(heights.max()), int(widths.max())
    lines = np.minimum(np.arange(high), heights[:, None] - 1) * widths[:, None] * 3
    tables = [offsets[:, None] + lines]
    weight_type = np.float64 if recipe.dtype == "float64" else np.float32
    for sides, out_side, flips, span in (
        (heights, recipe.size[0], rows[:, 5], high),
        (widths, recipe.size[1], rows[:, 4], wide),
    ):
        index, weights = filter_taps(sides, out_side, flips, span)
        tables += [index, weights.astype(weight_type)]
    return tables


def to_device(buffer: Any, device: Any) -> Any:
    """The one host-to-device copy of a staged batch (none on the CPU)."""
    if device.type != "cuda":
        return buffer
    return buffer.to(device, non_blocking=True)


def filter_taps(
    sides: np.ndarray, out_side: int, flips: np.ndarray, span: int
) -> tuple[np.ndarray, np.ndarray]:
    """Input index and weight of each tap of each output pixel, ``(n, out_side, taps)`` each.

    torch's antialiased bilinear filter (``_upsample_bilinear2d_aa``) along one axis of ``n``
    crops of ``sides`` pixels: a triangle as wide as the scale when shrinking, normalised over
    the pixels it covers. A flipped crop's outputs are in reverse order; taps past a crop's
    side have weight 0 (their index is kept below ``span``, the part's widest side).
    """
    scale = sides.astype(np.float64) / out_side
    support = np.maximum(scale, 1.0)[:, None]
    center = scale[:, None] * (np.arange(out_side) + 0.5)
    first = np.maximum((center - support + 0.5).astype(np.int64), 0)  # C's truncation, as torch
    stop = np.minimum((center + support + 0.5).astype(np.int64), sides[:, None])
    index = first[..., None] + np.arange(int((stop - first).max()))
    weights = np.maximum(1.0 - np.abs((index - center[..., None] + 0.5) / support[..., None]), 0)
    weights[index >= stop[..., None]] = 0.0
    weights /= weights.sum(axis=-1, keepdims=True)
    flipped = flips.astype(bool)
    index[flipped], weights[flipped] = index[flipped, ::-1], weights[flipped, ::-1]
    return np.minimum(index, span - 1), weights


def resize_pixels_into(out: Any, staged: StagedPixels, device_buffer: Any) -> None:
    """Crop, resize and flip every staged crop into ``out`` (its rows in the batch's order).

    Per part, whatever its number of crops: one gather of the crop lines (from the flat
    pixels, through an overlapping strided view: line ``i`` is ``span`` bytes from its offset),
    one conversion to float, two ``scatter_add`` making each crop's dense filter matrices from
    its taps, and two batched matrix products (columns, then rows; a transpose between them).
    Results are those of ``interpolate(..., antialias=True)`` on each crop to float rounding.

    Args:
        out: ``(n, 3, H, W)`` float batch (``float32``/``float64``) on the device.
        staged: The host side (:func:`stage_pixels`).
        device_buffer: ``staged.buffer`` on the device (:func:`to_device`).
    """
    import torch

    dtypes = {"int64": torch.int64, "float32": torch.float32, "float64": torch.float64}
    tables = [
        device_buffer[at : at + int(np.prod(shape)) * dtype.itemsize]
        .view(dtypes[dtype.name])
        .view(shape)
        for at, dtype, shape in staged.sections
    ]
    pixels = device_buffer[staged.pixels_at :]
    height, width = int(out.shape[-2]), int(out.shape[-1])
    with torch.autocast(out.device.type, enabled=False):  # float32 filters, also in autocast
        for number, (start, stop, high, wide) in enumerate(staged.parts):
            lines, y_index, y_weights, x_index, x_weights = tables[5 * number : 5 * number + 5]
            count, span = stop - start, 3 * wide
            windows = pixels.as_strided(
                (pixels.numel() - span + 1, span), (1, 1), pixels.storage_offset()
            )
            block = windows.index_select(0, lines.view(-1)).view(count, high, span).to(out.dtype)
            rows = out.new_zeros((count, height, high)).scatter_add_(2, y_index, y_weights)
            columns = out.new_zeros((count, width, wide)).scatter_add_(2, x_index, x_weights)
            tall = torch.bmm(rows, block).view(count, height, wide, 3)  # each column resized
            planes = tall.permute(0, 3, 1, 2).reshape(count, 3 * height, wide)
            target = out[start:stop].view(count, 3 * height, width)
            torch.bmm(planes, columns.transpose(1, 2), out=target)


def pixel_images(staged: StagedPixels, device_buffer: Any, rows: np.ndarray) -> list[Any]:
    """Whole staged images (no recipe) as ``(3, H, W)`` views of the device buffer."""
    pixels = device_buffer[staged.pixels_at :]
    images, at = [], 0
    for height, width in rows[:, 2:4].tolist():
        images.append(pixels[at : at + height * width * 3].view(height, width, 3).permute(2, 0, 1))
        at += height * width * 3
    return images
