"""Turning raw samples into training values: images, labels, parsed JSON.

Modes: ``"raw"`` keeps image bytes, ``"pil"`` gives ``PIL.Image`` (RGB), ``"rgb8"`` gives a
``uint8`` tensor of shape ``(3, H, W)``, or pass any callable ``f(bytes, extension) -> value``.
Images decode through :mod:`~shardstream.streaming._decoding.fastcrop`, or through the crop-window
fast path (:mod:`~shardstream.streaming._decoding.fastcrop`) for ``RandomResizedCrop`` transforms.
Pixel members (``KEY.pixels.npy``, ``build --pixels``) are the image, already decoded
(:mod:`~shardstream.streaming._decoding.fastcrop`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from shardstream._format import codecs
from shardstream._format.codecs import is_pixels
from shardstream.errors import ConfigError, DecodeError
from shardstream.streaming._decoding.encoded import (
    CropDraw,
    EncodedImage,
    KeepEncoded,
    crop_draw_for,
)
from shardstream.streaming._decoding.fastcrop import (
    CropDecoder,
    crop_decoder_for,
    decode_image,
    min_side_of,
    pixel_image,
)

__all__ = ["DECODE_MODES", "SampleConverter", "split_sample"]

DECODE_MODES = ("raw", "pil", "rgb8")
ImageDecoder = Callable[[bytes, str], Any]


def split_sample(
    sample: dict[str, Any],
    decode: str | ImageDecoder,
    min_side: int | None = None,
    allow_pickle: bool = False,
) -> tuple[Any, int, dict[str, Any]]:
    """Decode one raw sample into ``(image, label, fields)``.

    The image is the first image member (None when there is none); the label comes from a
    ``.cls``-like member (-1 when missing); ``fields`` holds ``__key__``, ``__url__`` and every
    other member decoded by extension (JSON parsed, unknown extensions left as bytes).

    Raises:
        DecodeError: A member does not decode; the message names shard and key.
    """
    image: Any = None
    label = -1
    fields: dict[str, Any] = {}
    for extension, value in sample.items():
        role = _ROLES.get(extension) or _role(extension)
        if role == _META:
            fields[extension] = value
        elif image is None and role == _IMAGE:  # raw: the reader's buffer, as it is
            image = (
                value
                if decode == "raw"
                else _decode_one(value, extension, decode, min_side, sample)
            )
        elif role == _LABEL and label == -1:
            try:
                label = int(value if isinstance(value, bytes) else bytes(value))
            except ValueError:  # decode_member raises the error that names shard and key
                label = int(codecs.decode_member(extension, value, _where(sample)))
        elif isinstance(value, (str, int, float, list, dict)) or value is None:
            fields[extension] = value  # a field attached by key (`shardstream attach`)
        else:
            fields[extension] = codecs.decode_member(extension, value, _where(sample), allow_pickle)
    return image, label, fields


_META, _IMAGE, _LABEL, _FIELD = 1, 2, 3, 4
#: Member extension -> its role in a sample (a few distinct extensions per dataset).
_ROLES: dict[str, int] = {}


def _role(extension: str) -> int:
    if extension.startswith("__"):
        role = _META
    elif codecs.is_image(extension) or is_pixels(extension):
        role = _IMAGE
    elif codecs.extension_of(extension.removesuffix(".gz")) in codecs.LABEL_EXTENSIONS:
        role = _LABEL  # "cls.gz" too: decoded as "cls", as webdataset does
    else:
        role = _FIELD
    if len(_ROLES) < 4096:
        _ROLES[extension] = role
    return role


def _where(sample: dict[str, Any]) -> str:
    return f"{sample.get('__url__', '?')}: key {sample.get('__key__', '?')!r}"


def _decode_one(
    data: bytes,
    extension: str,
    decode: str | ImageDecoder,
    min_side: int | None,
    sample: dict[str, Any],
) -> Any:
    if decode == "raw":
        return data
    try:
        if callable(decode):  # users' decoders get bytes; ours take the reader's buffer too
            ours = isinstance(decode, (CropDecoder, CropDraw, KeepEncoded))
            return decode(data if ours else bytes(data), extension)
        if decode not in DECODE_MODES:
            raise ConfigError(_unknown_mode(decode))
        if is_pixels(extension):
            return pixel_image(data, decode)
        return decode_image(data, extension, decode, min_side)
    except ConfigError:
        raise
    except Exception as error:
        raise DecodeError(
            f"{_where(sample)}: image member {extension!r} ({len(data)} bytes) does not decode: "
            f"{error}. Rebuild the shard, or pass on_error='skip' to skip and count such samples."
        ) from error


class SampleConverter:
    """Turns a raw sample into what the dataset yields: ``(image, label)`` or a dict.

    A sample marked ``__valid__`` (``policy="mask"``) keeps the mark: ``(image, label, valid)``,
    or the dict's ``__valid__`` field.

    The decode/transform policy lives here: a torchvision v2 ``Compose`` that starts with
    ``RandomResizedCrop`` takes the fast crop decoder (see
    :mod:`~shardstream.streaming._decoding.fastcrop`), which also applies the transform;
    otherwise the image is decoded (at reduced JPEG scale when the transform shrinks it anyway)
    and then transformed.

    With a :class:`~.gpudecode.GpuDecode` as ``decode``, images are not decoded here: each
    leaves as an :class:`~.encoded.EncodedImage` with its crop and flips drawn (when the
    transform is recognised), for the device decoder in the training process; of a pixel
    member, only the crop's pixels leave.

    Args:
        decode: ``"raw"``, ``"pil"``, ``"rgb8"``, a callable ``f(bytes, extension)``, or a
            :class:`~.gpudecode.GpuDecode` (resolved by the dataset).
        transform: Applied to each decoded image, or None.
        output: ``"pair"`` or ``"dict"``.
        allow_pickle: Unpickle ``.pyd``/``.pth`` members.
        batched: Samples are collated afterwards: raw images may stay the reader's buffer (a
            ``memoryview``, packed without a copy), and fast-path crops may be
            :class:`~.fastcrop.PendingImage` values (finished as they are written into the
            batch); otherwise raw images are handed out as ``bytes``.

    Examples:
        >>> convert = SampleConverter("raw")
        >>> convert({"__key__": "k", "jpg": b"...", "cls": b"3"})
        (b'...', 3)
    """

    def __init__(
        self,
        decode: str | ImageDecoder,
        transform: Callable[[Any], Any] | None = None,
        output: str = "pair",
        allow_pickle: bool = False,
        batched: bool = False,
    ) -> None:
        if output not in ("pair", "dict"):
            raise ConfigError(f"output must be 'pair' or 'dict', got {output!r}")
        if isinstance(decode, str) and decode not in DECODE_MODES:
            raise ConfigError(_unknown_mode(decode))
        self.decode, self.transform = decode, transform
        self.output, self.allow_pickle, self.batched = output, allow_pickle, batched
        self._min_side = min_side_of(transform) if transform is not None else None
        # Fast path: RandomResizedCrop-first transforms decode only the resolution they keep.
        self._crop_decoder = (
            crop_decoder_for(transform, decode, batched) if isinstance(decode, str) else None
        )
        # Device decoding: hand images over encoded, their crops drawn here (also transforms).
        self._encoder: CropDraw | KeepEncoded | None = None
        if _is_device_decode(decode):
            self._encoder = crop_draw_for(transform) or KeepEncoded()
        #: Loader statistics: an object with ``decode_s`` and ``transform_s`` float attributes
        #: to add to, set per reading process; None when statistics are off.
        self.clock: Any = None

    def __call__(self, sample: dict[str, Any]) -> Any:
        decode = self._encoder or self._crop_decoder or self.decode  # these also transform
        clock = self.clock
        started = time.perf_counter() if clock is not None else 0.0
        image, label, fields = split_sample(sample, decode, self._min_side, self.allow_pickle)
        if isinstance(image, EncodedImage):  # packed into a batch, or bytes for one sample
            data = image.data if self.batched else bytes(image.data)
            key, url = str(sample.get("__key__", "?")), str(sample.get("__url__", "?"))
            image = image._replace(data=data, key=key, url=url)
        elif isinstance(image, (bytearray, memoryview)) and not (
            self.batched and self.transform is None
        ):
            image = bytes(image)  # raw images leave as bytes, except into a batch (packed)
        if clock is not None:
            decoded = time.perf_counter()
            clock.decode_s += decoded - started
        transformed = self._crop_decoder is not None or self._encoder is not None
        if self.transform is not None and image is not None and not transformed:
            image = self.transform(image)
            if clock is not None:
                clock.transform_s += time.perf_counter() - decoded
        if self.output == "pair":
            valid = fields.get("__valid__")  # policy="mask": a third item says whether it counts
            return (image, label) if valid is None else (image, label, valid)
        return {**fields, "image": image, "label": label}


def _unknown_mode(decode: object) -> str:
    choices = ", ".join(repr(mode) for mode in (*DECODE_MODES, "cuda", "cuda:N"))
    return (
        f"decode must be one of {choices}, a GpuDecode or a callable f(bytes, extension), "
        f"got {decode!r}"
    )


def _is_device_decode(decode: Any) -> bool:
    from shardstream.streaming._decoding.gpudecode import GpuDecode

    return isinstance(decode, GpuDecode)
