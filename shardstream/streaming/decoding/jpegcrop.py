"""Optional crop-window JPEG decoding: decode only the rows and columns of a crop.

Used by :mod:`shardstream.streaming.decoding.fastcrop` when ``nvidia-nvimgcodec-cu13`` (or
``-cu12``) is installed (``pip install "shardstream[fastjpeg]"``). nvImageCodec's CPU backend is
libjpeg-turbo with a region of interest: rows below the crop are never entropy-decoded, and
columns outside it are never transformed or colour-converted. It needs no GPU and no CUDA driver.
Its output equals a full libjpeg-turbo decode cropped afterwards (same IDCT, same fancy
upsampling; the tests check this bit for bit).

Everything here is best effort: when the package is missing, fails to load, or cannot decode a
stream, :func:`decode_window` returns None and the caller decodes the usual way (which also
raises the usual error for broken data).

Quiet: without the ``nvidia-nvjpeg*`` wheels, importing nvImageCodec prints "Failed to load
nvJPEG" lines to stderr, and its logger prints libjpeg's messages for broken streams. The import
is therefore done once per process with file descriptor 2 pointed at ``/dev/null`` and the
logger's ``PYNVIMGCODEC_VERBOSITY`` set to 0 (the variable is read at import only and is
restored right after; a value the user set is kept).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

from shardstream.storage.processlocal import ProcessLocal

__all__ = ["decode_window", "is_available", "quiet_import"]

#: libjpeg-turbo turns fancy (smooth) chroma upsampling off when a subsampled component is at
#: most 2 samples wide, so a window only a few pixels wide would decode differently from the
#: full image. 16 columns keep every subsampled component (up to 4x) wider than that.
_MIN_WIDTH = 16

#: Each thread's decoder, per process (a forked child makes its own).
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
