"""Image decoding and its fast paths: crop windows, pixel members, ``RandomResizedCrop`` first.

Crop-window JPEG decoding (optional: ``pip install "shardstream[fastjpeg]"``, nvImageCodec's
CPU backend, libjpeg-turbo with a region of interest; no GPU or CUDA driver needed): rows below
the crop are never entropy-decoded, columns outside it never transformed or colour-converted,
and the pixels equal a full decode cropped afterwards (the tests check this bit for bit). Best
effort: when the package is missing, fails to load or cannot decode a stream,
:func:`decode_window` returns None and the caller decodes the usual way (which raises the usual
error for broken data). Its import is quiet: without the ``nvidia-nvjpeg*`` wheels it prints
"Failed to load nvJPEG" to stderr, so it runs once per process with file descriptor 2 on
``/dev/null`` and ``PYNVIMGCODEC_VERBOSITY=0`` (read at import only, then restored; a value the
user set is kept).

Pixel members (``KEY.pixels.npy``, :mod:`shardstream._format.codecs`, ``build --pixels``) are
already ``uint8`` height x width x 3: :func:`pixel_tensor` wraps the reader's buffer as a
``(3, H, W)`` tensor without a copy, :func:`pixel_image` hands it out in a decode mode, and
:func:`resize_pixel_crop` cuts a crop from it and resizes it (no decode).

Decoding one image (:func:`decode_image`): ``"pil"`` gives ``PIL.Image`` (RGB), ``"rgb8"`` a
``uint8`` ``(3, H, W)`` tensor; when the transform shrinks every image to at least ``min_side``
pixels anyway (:func:`min_side_of`), large JPEGs are decoded at a reduced DCT scale (Pillow
``draft``), several times faster and losing nothing the transform keeps.

Fast path for a torchvision v2 ``Compose`` that starts with ``RandomResizedCrop``
(:class:`CropDecoder`): the crop is drawn first, from the JPEG header's size or the stored
size (:func:`draw_crop_box`: the transform's own torch RNG draws, so seeded runs give the same
crops on JPEG and pixel shards), then only enough is decoded, by what measured fastest:

- with ``shardstream[fastjpeg]`` installed, unless the crop is at least 4x the output on both
  sides: only the crop window (faster than a full decode, README: *Streaming*);
- crop at least 2x (4x, 8x) the output on both sides: 1/2 (1/4, 1/8) DCT scale (Pillow
  ``draft``), skipping only resolution the resize throws away (1/2 only without the window
  decoder: there a full-resolution window is as fast or faster);
- otherwise the full image with libjpeg-turbo (``torchvision.io.decode_jpeg``, measured faster
  than Pillow here);

then the crop is resized on the ``uint8`` tensor (torch's antialiased bilinear ``uint8``
kernel), and the usual remaining steps run fused (:class:`FusedTail`: flips on ``uint8``, then
``ToDtype``/``Normalize`` as one multiply-add); into a batch, the multiply-add is left to the
collation (:class:`PendingImage`), which writes it straight into the batch's (shared-memory)
buffer. Pixels match the generic path within resampling rounding. Anything else (non-JPEG,
other transforms, other interpolation) takes the generic path."""

from __future__ import annotations

import contextlib
import importlib
import io
import math
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardstream._format import codecs
from shardstream._format.codecs import is_pixels, pixel_array
from shardstream._storage.background import ProcessLocal

__all__ = [
    "CropDecoder",
    "FusedTail",
    "PendingImage",
    "crop_decoder_for",
    "decode_image",
    "decode_jpeg_rgb",
    "decode_window",
    "draw_crop_box",
    "draw_pixel_crop",
    "fuse_tail",
    "is_available",
    "min_side_of",
    "pixel_image",
    "pixel_tensor",
    "quiet_import",
    "resize_pixel_crop",
    "writable_bytes",
]


#: libjpeg-turbo turns fancy (smooth) chroma upsampling off when a subsampled component is at
#: most 2 samples wide, so a window only a few pixels wide would decode differently from the
#: full image. 16 columns keep every subsampled component (up to 4x) wider than that.
_MIN_WIDTH = 16

#: ``RandomResizedCrop.make_params``'s keys, in the order of :func:`draw_crop_box`'s box.
_BOX = ("top", "left", "height", "width")

#: Each thread's decoder and draw buffers, per process (a forked child makes its own).
_threads: ProcessLocal[threading.local] = ProcessLocal(threading.local)
_import_lock = threading.Lock()


class _WindowDecoder:
    """One nvImageCodec CPU decoder (one thread, no EXIF rotation, RGB interleaved output)."""

    def __init__(self, module: Any) -> None:
        self.module = module
        self.decoder = module.Decoder(
            device_id=module.NVIMGCODEC_DEVICE_CPU_ONLY,
            max_num_cpu_threads=1,  # parallelism comes from DataLoader workers
            backends=[module.Backend(module.BackendKind.CPU_ONLY)],
        )
        # Pillow and torchvision ignore EXIF orientation and ICC profiles; do the same.
        self.params = module.DecodeParams(
            apply_exif_orientation=False,
            color_spec=module.ColorSpec.SRGB,
            sample_format=module.SampleFormat.I_RGB,
        )

    def decode(self, data: bytes, top: int, left: int, height: int, width: int) -> Any:
        module = self.module
        region = module.Region(top, left, top + height, left + width)
        stream = module.CodeStream(data).get_sub_code_stream(region=region)
        image = self.decoder.decode(stream, params=self.params)
        return None if image is None else image.cpu()


def is_available() -> bool:
    """True when crop-window decoding works in this process (nvImageCodec imports and runs)."""
    return _decoder() is not None


def decode_window(data: bytes, top: int, left: int, height: int, width: int) -> Any | None:
    """Decode only the window ``(top, left, height, width)`` of a baseline/progressive JPEG.

    Returns:
        The window's pixels as a ``uint8`` RGB array of shape ``(height, width, 3)`` (it
        supports ``__array_interface__``; ``numpy.asarray`` wraps it without a copy), or None
        when crop-window decoding is unavailable or this stream does not decode with it.
    """
    if width < _MIN_WIDTH:
        return None
    decoder = _decoder()
    if decoder is None:
        return None
    try:
        pixels = decoder.decode(data, top, left, height, width)
    except Exception:  # any failure: the caller decodes the usual way
        return None
    if pixels is None or tuple(pixels.shape) != (height, width, 3):
        return None
    return pixels


def _decoder() -> _WindowDecoder | None:
    local = _threads.get()
    if not hasattr(local, "decoder"):
        local.decoder = _create_decoder()
    return local.decoder


def _create_decoder() -> _WindowDecoder | None:
    try:
        with _import_lock:
            if "nvidia.nvimgcodec" not in sys.modules:
                with quiet_import():
                    importlib.import_module("nvidia.nvimgcodec")
            return _WindowDecoder(importlib.import_module("nvidia.nvimgcodec"))
    except Exception:  # not installed, or its libraries fail to load: no crop-window decoding
        return None


@contextlib.contextmanager
def quiet_import() -> Iterator[None]:
    """Send fd 2 to /dev/null and set ``PYNVIMGCODEC_VERBOSITY=0`` for the duration."""
    key = "PYNVIMGCODEC_VERBOSITY"
    user_value = os.environ.get(key)
    if user_value is None:
        os.environ[key] = "0"
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
        if user_value is None:
            os.environ.pop(key, None)


def pixel_tensor(data: Any, where: str = "") -> Any:
    """A pixel member as a ``uint8`` tensor of shape ``(3, height, width)`` (a permuted view).

    The tensor shares the reader's buffer when that buffer is writable (a copy-on-write map,
    a receive buffer); read-only bytes are copied once, as torch wraps only writable memory.

    Raises:
        DecodeError: The member is not a pixel array (see
            :func:`~shardstream._format.codecs.pixel_array`).
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


def draw_crop_box(crop: Any, height: int, width: int) -> tuple[int, int, int, int]:
    """``RandomResizedCrop``'s box ``(top, left, height, width)`` on an image of that size.

    ``v2.RandomResizedCrop.make_params``'s draws bit for bit (the same ``uniform_``, ``exp`` and
    ``randint`` kernels on the default generator, in its order), on reused one-element tensors
    instead of new ones per attempt: a third of its CPU time, measured. Subclasses (and a
    torchvision without ``_log_ratio``) get their own ``make_params``."""
    import torch
    from torchvision.transforms import v2

    log_ratio = getattr(crop, "_log_ratio", None)
    if type(crop).make_params is not v2.RandomResizedCrop.make_params or log_ratio is None:
        # make_params reads only the size: a one-byte tensor expanded to it, not the pixels
        params = crop.make_params([torch.empty(1, dtype=torch.uint8).expand(3, height, width)])
        return params["top"], params["left"], params["height"], params["width"]
    real, integer = _draw_buffers()
    area = height * width
    for _ in range(10):
        target_area = area * real.uniform_(crop.scale[0], crop.scale[1]).item()
        aspect_ratio = real.uniform_(float(log_ratio[0]), float(log_ratio[1])).exp_().item()
        crop_width = round(math.sqrt(target_area * aspect_ratio))
        crop_height = round(math.sqrt(target_area / aspect_ratio))
        if 0 < crop_width <= width and 0 < crop_height <= height:
            top = integer.random_(0, height - crop_height + 1).item()
            left = integer.random_(0, width - crop_width + 1).item()
            return top, left, crop_height, crop_width
    in_ratio = float(width) / float(height)  # no fit in 10 draws: the central crop
    if in_ratio < min(crop.ratio):
        crop_width, crop_height = width, round(width / min(crop.ratio))
    elif in_ratio > max(crop.ratio):
        crop_width, crop_height = round(height * max(crop.ratio)), height
    else:
        crop_width, crop_height = width, height
    return (height - crop_height) // 2, (width - crop_width) // 2, crop_height, crop_width


def _draw_buffers() -> tuple[Any, Any]:
    """This thread's one-element tensors to draw on: the default dtype's (``torch.empty(1)``'s)
    and ``int64`` (``torch.randint``'s)."""
    import torch

    local = _threads.get()
    buffers = getattr(local, "draws", None)
    if buffers is None or buffers[0].dtype != torch.get_default_dtype():
        buffers = local.draws = (torch.empty(1), torch.empty(1, dtype=torch.int64))
    return buffers


def draw_pixel_crop(
    crop: Any, data: Any, where: str = ""
) -> tuple[np.ndarray, tuple[int, int, int, int], tuple[int, int]]:
    """``RandomResizedCrop``'s box drawn on a pixel member (:func:`draw_crop_box`, as the CPU
    path draws), and a copy of only its pixels: what the GPU stage's workers hand over.

    Returns:
        The crop's pixels (a C-ordered ``uint8`` ``(height, width, 3)`` array of its own), the
        box ``(top, left, height, width)``, and the stored image's ``(height, width)``.
    """
    array = pixel_array(data, where)
    height, width, _ = array.shape
    box = draw_crop_box(crop, height, width)
    top, left, crop_height, crop_width = box
    return array[top : top + crop_height, left : left + crop_width].copy(), box, (height, width)


def resize_pixel_crop(
    array: np.ndarray,
    box: tuple[int, int, int, int],
    out_size: tuple[int, int],
    mirror: bool = False,
    upside_down: bool = False,
) -> tuple[Any, bool]:
    """The ``box`` of a stored ``(H, W, 3)`` image, flipped as asked, resized to ``out_size``.

    Only the crop is copied out of the reader's buffer, as one channels-last block: what torch's
    vectorised ``uint8`` antialiased bilinear kernel reads (measured several times faster than a
    permuted view, and than Pillow). The flips act on that block, before the resize, which
    commutes with them exactly (symmetric filters; the tests check sides 1-519): a mirror is one
    vectorised reversal of each row's bytes (flipping the channels-last output is a slow
    per-pixel copy), which also reverses each pixel's channels.

    Returns:
        The ``uint8`` ``(3, height, width)`` tensor (channels-last strides, its own memory), and
        True when its channels are in reverse order (mirrored: :meth:`FusedTail.write`).
    """
    import torch

    top, left, height, width = box
    cut = array[top : top + height, left : left + width]
    block = torch.from_numpy((cut[::-1] if upside_down else cut).copy())
    if mirror:
        block = block.view(height, width * 3).flip(-1)
    # (1, H, W, 3) -> (1, 3, H, W): channels-last strides with a real batch stride (unsqueeze
    # gives a stride torch's fast kernel does not take: measured 2x slower)
    resized = torch.nn.functional.interpolate(
        block.view(1, height, width, 3).permute(0, 3, 1, 2),
        size=list(out_size),
        mode="bilinear",
        align_corners=False,
        antialias=True,
    )[0]
    return resized, mirror


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


def crop_decoder_for(transform: Any, mode: str, batched: bool = False) -> CropDecoder | None:
    """A :class:`CropDecoder` when ``transform`` qualifies for the fast path, else None.

    Qualifies: a torchvision v2 ``Compose`` whose first step is ``RandomResizedCrop`` with
    bilinear, antialiased resizing, followed only by flips, ``PILToTensor``/``ToImage``,
    ``ToDtype``/``ToPureTensor`` and ``Normalize``; ``mode`` must be ``"pil"`` or ``"rgb8"``.
    ``batched``: every image goes into a batch that the worker collates, so the decoder may
    hand out :class:`PendingImage` values (see :class:`CropDecoder`).
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
    return CropDecoder(transform, mode, batched)


class CropDecoder:
    """Decode + ``RandomResizedCrop`` + the remaining steps, decoding no more than needed.

    Use :func:`crop_decoder_for` to build one; call it as ``decoder(data, extension)``.

    Args:
        transform: A qualifying v2 ``Compose`` (see :func:`crop_decoder_for`).
        mode: The dataset's decode mode, used by the generic fallback.
        batched: Hand out a :class:`PendingImage` (the flipped ``uint8`` crop, its dtype
            conversion and ``Normalize`` left to the batch write) wherever the steps after the
            crop fuse; only for images that the worker's own collation stacks.
    """

    def __init__(self, transform: Any, mode: str, batched: bool = False) -> None:
        from torchvision.transforms import v2

        self.transform, self.mode, self.batched = transform, mode, batched
        self.crop = transform.transforms[0]
        # v2.Compose refuses no steps: Compose([RandomResizedCrop(224)]) has none after the crop
        self.rest = v2.Compose(list(transform.transforms[1:]) or [v2.Identity()])
        self.tail = fuse_tail(transform.transforms[1:])  # None: run ``rest`` step by step
        height, width = self.crop.size
        self.out_size = (int(height), int(width))

    def __call__(self, data: bytes, extension: str) -> Any:
        """Decode, crop, resize and transform one image; the generic path for non-JPEGs. Pixel
        members (``build --pixels``) are not decoded: the crop is cut from their pixels."""
        from PIL import Image

        if is_pixels(extension):
            return self._pixels(data)
        image = None
        if codecs.extension_of(extension) in ("jpg", "jpeg"):
            image = Image.open(io.BytesIO(data))
        if image is None or image.format != "JPEG":
            return self.transform(decode_image(data, extension, self.mode))
        width, height = image.size
        params = dict(zip(_BOX, draw_crop_box(self.crop, height, width), strict=True))
        pixels = self._decode_window(data, image, params)
        if pixels is None:
            pixels = self._resize(*self._decode(data, image, params), params)
        tail = self.tail
        return self.rest(pixels) if tail is None else self._finish(tail, tail.flip(pixels), False)

    def _pixels(self, data: Any) -> Any:
        """A pixel member: the crop and flips drawn as for a JPEG, then cut and resized."""
        array, tail = pixel_array(data, ""), self.tail
        box = draw_crop_box(self.crop, array.shape[0], array.shape[1])
        if tail is None:  # the steps after the crop draw their own flips
            return self.rest(resize_pixel_crop(array, box, self.out_size)[0])
        mirror, upside_down = tail.draw_flips()
        resized = resize_pixel_crop(array, box, self.out_size, mirror, upside_down)
        return self._finish(tail, *resized)

    def _finish(self, tail: FusedTail, pixels: Any, reversed_channels: bool) -> Any:
        """The flipped ``uint8`` crop converted and normalised (pending, into a batch)."""
        if self.batched:
            return PendingImage(pixels, tail, reversed_channels)
        return tail.finish(pixels, reversed_channels)

    def reduction(self, params: dict[str, int]) -> int:
        """Largest DCT reduction (1, 2, 4 or 8) keeping the crop >= the output on both sides."""
        out_height, out_width = self.out_size
        for factor in (8, 4, 2):
            if params["height"] >= factor * out_height and params["width"] >= factor * out_width:
                return factor
        return 1

    def _decode_window(self, data: bytes, image: Any, params: dict[str, int]) -> Any | None:
        """The resized crop from a crop-window decode (this module), or None."""
        import torch
        from torchvision.transforms.v2 import functional

        if image.mode != "RGB" or self.reduction(params) > 2:
            return None  # grey, CMYK: Pillow's colours. 1/4 and 1/8 DCT scale beat the window
        box = params["top"], params["left"], params["height"], params["width"]
        window = decode_window(data, *box)
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

    Same results as the v2 steps one by one (to float rounding), same torch RNG draws in the same
    order (one ``torch.rand(1)`` per random flip, as ``v2.RandomHorizontalFlip``). Flips and
    per-channel affine maps commute, so the flips run first on the small ``uint8`` tensor, then
    ``uint8 * scale + shift`` makes the float output (contiguous). Built by :func:`fuse_tail`.
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
        return self.finish(self.flip(pixels))

    def draw_flips(self) -> tuple[bool, bool]:
        """``(horizontal, vertical)``: one ``torch.rand(1)`` per flip step, in order, as the v2
        steps draw; two flips on one axis cancel."""
        import torch

        flipped = {-1: False, -2: False}
        for probability, dim in self.flips:
            if torch.rand(1) < probability:
                flipped[dim] = not flipped[dim]
        return flipped[-1], flipped[-2]

    def flip(self, pixels: Any) -> Any:
        """The random flips drawn (:meth:`draw_flips`) and applied to ``(..., H, W)`` pixels."""
        horizontal, vertical = self.draw_flips()
        pixels = pixels.flip(-1) if horizontal else pixels
        return pixels.flip(-2) if vertical else pixels

    @property
    def out_dtype(self) -> Any:
        """The dtype of the output (None: the input's)."""
        return self.scale.dtype if self.scale is not None else self.dtype

    def write(self, pixels: Any, out: Any, reversed_channels: bool = False) -> None:
        """:meth:`finish` of ``pixels`` written into ``out`` (its shape, :attr:`out_dtype`): one
        converting copy (channels put back in order if ``pixels`` holds them last to first),
        then the multiply-add in place (measured 2x faster than copying a new float image)."""
        import torch

        if reversed_channels or out.dtype == torch.uint8:
            # numpy takes the reversed channels as a view, and copies channels-last uint8 into
            # planes in half the time torch takes (for float, torch's copy is as fast)
            source = pixels.numpy()
            np.copyto(out.numpy(), source[::-1] if reversed_channels else source, "unsafe")
        else:
            out.copy_(pixels)
        if self.scale is not None and self.shift is not None:
            out.mul_(self.scale).add_(self.shift)

    def finish(self, pixels: Any, reversed_channels: bool = False) -> Any:
        """The (flipped) ``uint8`` crop converted and normalised, as a new contiguous tensor."""
        import torch
        from torchvision import tv_tensors

        out = torch.empty(pixels.shape, dtype=self.out_dtype or pixels.dtype)
        self.write(pixels, out, reversed_channels)
        return tv_tensors.Image(out) if self.as_image else out


class PendingImage:
    """A flipped ``uint8`` crop whose dtype conversion and ``Normalize`` are still to run.

    :class:`CropDecoder` hands these out for images that the worker's collation stacks
    (``batched``): :func:`~shardstream.streaming._worker.batch.stack_or_list` writes each one
    into its row of the batch's buffer (:meth:`write`) instead of making a float image per
    sample and copying it into the batch; anything else calls :meth:`finish`. Both give exactly
    what :class:`FusedTail` gives.

    Attributes:
        pixels: The resized, flipped ``uint8`` ``(3, height, width)`` crop.
        tail: The :class:`FusedTail` to finish it with.
        reversed_channels: ``pixels`` holds its channels last to first (see
            :func:`resize_pixel_crop`).
    """

    __slots__ = ("pixels", "reversed_channels", "tail")

    def __init__(self, pixels: Any, tail: FusedTail, reversed_channels: bool = False) -> None:
        self.pixels, self.tail, self.reversed_channels = pixels, tail, reversed_channels

    def __repr__(self) -> str:
        return f"PendingImage(shape={tuple(self.shape)}, dtype={self.dtype})"

    @property
    def shape(self) -> Any:
        return self.pixels.shape

    @property
    def dtype(self) -> Any:
        """The dtype of the finished image."""
        return self.tail.out_dtype or self.pixels.dtype

    def finish(self) -> Any:
        """The finished image, as :class:`FusedTail` returns it."""
        return self.tail.finish(self.pixels, self.reversed_channels)

    def write(self, out: Any) -> None:
        """Write the finished image into ``out`` (shape :attr:`shape`, dtype :attr:`dtype`)."""
        self.tail.write(self.pixels, out, self.reversed_channels)


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
