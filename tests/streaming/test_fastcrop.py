"""The RandomResizedCrop fast path agrees with the generic decode-then-transform path.

Covers the fused flip/ToDtype/Normalize tail, and the optional crop-window JPEG decoder
(through a stand-in everywhere; the real nvImageCodec one only where it is installed).
"""

from __future__ import annotations

import io
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from shardstream.streaming._decoding import fastcrop as jpegcrop
from shardstream.streaming._decoding.fastcrop import (
    crop_decoder_for,
    decode_image,
    draw_crop_box,
    fuse_tail,
)
from tests.conftest import encode_image


def _photo(width: int, height: int, seed: int) -> bytes:
    """A smooth, photo-like JPEG (gradients plus blobs), so resampling differences stay small."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    channels = []
    for _ in range(3):
        fx, fy, phase = rng.uniform(2, 9), rng.uniform(2, 9), rng.uniform(0, 6)
        wave = np.sin(x / width * fx + phase) * np.cos(y / height * fy)
        channels.append(128 + 100 * wave)
    pixels = np.stack(channels, axis=-1).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=92)
    return buffer.getvalue()


def _train(size: int = 64, scale: tuple[float, float] = (0.08, 1.0)) -> v2.Compose:
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, scale=scale, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
        ]
    )


@pytest.mark.parametrize(("width", "height", "mode"), [(900, 700, "pil"), (333, 250, "rgb8")])
def test_fast_path_matches_generic_path(width: int, height: int, mode: str) -> None:
    transform = _train()
    decoder = crop_decoder_for(transform, mode)
    assert decoder is not None
    reductions = set()
    for seed in range(12):
        data = _photo(width, height, seed)
        torch.manual_seed(seed)
        slow = transform(decode_image(data, "jpg", mode))
        torch.manual_seed(seed)
        params = decoder.crop.make_params([Image.open(io.BytesIO(data))])
        reductions.add(decoder.reduction(params))
        torch.manual_seed(seed)
        fast = decoder(data, "jpg")
        assert fast.shape == slow.shape == (3, 64, 64) and fast.dtype == slow.dtype
        assert (fast - slow).abs().mean() < 0.02, f"seed {seed}"
    if width > 500:
        assert reductions & {2, 4, 8}  # the reduced decode was exercised


def test_fast_path_is_deterministic_when_seeded() -> None:
    decoder = crop_decoder_for(_train(), "pil")
    assert decoder is not None
    data = _photo(640, 480, 0)
    torch.manual_seed(5)
    first = decoder(data, "jpg")
    torch.manual_seed(5)
    assert torch.equal(first, decoder(data, "jpg"))


def test_fallbacks() -> None:
    transform = _train()
    decoder = crop_decoder_for(transform, "pil")
    assert decoder is not None
    png = encode_image(40, 30, seed=1, fmt="PNG")
    torch.manual_seed(0)
    slow = transform(decode_image(png, "png", "pil"))
    torch.manual_seed(0)
    assert torch.equal(decoder(png, "png"), slow)
    assert crop_decoder_for(transform, "raw") is None
    assert crop_decoder_for(v2.Compose([v2.Resize(32), v2.CenterCrop(32)]), "pil") is None
    jitter = v2.Compose([v2.RandomResizedCrop(32), v2.ColorJitter(0.1)])
    assert crop_decoder_for(jitter, "pil") is None
    nearest = v2.RandomResizedCrop(32, interpolation=v2.InterpolationMode.NEAREST)
    assert crop_decoder_for(v2.Compose([nearest]), "pil") is None


class _Centre(v2.RandomResizedCrop):
    """A subclass with its own draws: drawn by its make_params."""

    def make_params(self, flat_inputs: list[object]) -> dict[str, int]:
        return {"top": 1, "left": 2, "height": 3, "width": 4}


@pytest.mark.parametrize("default_dtype", [torch.float32, torch.float64])
def test_crop_boxes_are_torchvisions_draws_bit_for_bit(default_dtype: torch.dtype) -> None:
    crops = [
        v2.RandomResizedCrop(224),
        v2.RandomResizedCrop(64, scale=(0.5, 0.9), ratio=(1.0, 1.0)),
        v2.RandomResizedCrop((48, 64), scale=(0.02, 1.0), ratio=(0.5, 3.0)),
    ]
    # (1, 900) never fits in 10 draws: the central-crop fallback, on each side of the ratios
    sizes = [(256, 341), (341, 256), (90, 500), (7, 5), (1, 1), (1, 900), (900, 1), (64, 64)]
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default_dtype)  # torchvision draws on torch.empty(1): this dtype
    try:
        for seed in range(12):
            for crop in crops:
                for height, width in sizes:
                    torch.manual_seed(seed)
                    size = torch.empty(1, dtype=torch.uint8).expand(3, height, width)
                    params = crop.make_params([size])
                    after = torch.randint(2**62, (1,))
                    torch.manual_seed(seed)
                    box = draw_crop_box(crop, height, width)
                    assert box == tuple(params[key] for key in ("top", "left", "height", "width"))
                    assert torch.equal(torch.randint(2**62, (1,)), after)  # the same draws
    finally:
        torch.set_default_dtype(previous)
    assert draw_crop_box(_Centre(8), 100, 100) == (1, 2, 3, 4)


MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _normalized(size: int = 64) -> v2.Compose:
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


@pytest.mark.parametrize("mode", ["pil", "rgb8"])
def test_fused_normalize_matches_generic_path(mode: str) -> None:
    transform = _normalized()
    decoder = crop_decoder_for(transform, mode)
    assert decoder is not None and decoder.tail is not None
    for seed in range(8):
        data = _photo(500, 375, seed)
        torch.manual_seed(seed)
        slow = transform(decode_image(data, "jpg", mode))
        after_slow = torch.rand(1)
        torch.manual_seed(seed)
        fast = decoder(data, "jpg")
        assert torch.equal(torch.rand(1), after_slow)  # the same number of RNG draws
        assert isinstance(fast, tv_tensors.Image) and isinstance(slow, tv_tensors.Image)
        assert fast.shape == slow.shape == (3, 64, 64) and fast.dtype == torch.float32
        assert fast.is_contiguous()
        # 1 uint8 level is 1 / (255 * std) ~ 0.017 after Normalize: the 0.02 bound of
        # test_fast_path_matches_generic_path, scaled by 1 / std.
        assert (fast - slow).abs().mean() < 0.02 / min(STD), f"seed {seed}"


def _tail_cases() -> list[list[object]]:
    return [
        [
            v2.RandomHorizontalFlip(),
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ],
        [v2.RandomVerticalFlip(0.3), v2.PILToTensor(), v2.RandomHorizontalFlip(0.7)],
        [
            v2.ToImage(),
            v2.ToDtype(torch.float64, scale=False),
            v2.Normalize([127.5], [64.0]),
            v2.Normalize([0.1, 0.2, 0.3], [2.0, 3.0, 4.0]),
            v2.ToPureTensor(),
        ],
        [v2.ToDtype(torch.uint8), v2.ToDtype(torch.float32), v2.ToDtype(torch.float32)],
        [
            v2.RandomHorizontalFlip(1.0),
            v2.ToDtype(torch.float32, scale=True),
            v2.RandomVerticalFlip(0.0),
        ],
    ]


@pytest.mark.parametrize("steps", _tail_cases())
def test_fused_tail_equals_the_steps_one_by_one(steps: list[object]) -> None:
    tail = fuse_tail(steps)
    assert tail is not None
    rest = v2.Compose(steps)
    crop = torch.randint(0, 256, (3, 40, 56), dtype=torch.uint8, generator=torch.Generator())
    channels_last = crop.permute(1, 2, 0).contiguous().permute(2, 0, 1)  # as resize returns it
    for seed in range(6):
        torch.manual_seed(seed)
        slow = rest(crop)
        after_slow = torch.rand(1)
        torch.manual_seed(seed)
        fast = tail(channels_last)
        assert torch.equal(torch.rand(1), after_slow)
        assert type(fast) is type(slow) and fast.dtype == slow.dtype and fast.is_contiguous()
        torch.testing.assert_close(fast, slow, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize(
    "steps",
    [
        [v2.Normalize(MEAN, STD)],  # Normalize on uint8 is an error: left to v2
        [v2.ToDtype(torch.float16, scale=True)],
        [v2.ToDtype(torch.float32, scale=True), v2.ToDtype(torch.uint8, scale=True)],
        [v2.ToDtype(torch.float32, scale=True), v2.Normalize(MEAN, [0.2, 0.0, 0.2])],
        [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.5, 0.5], [0.5, 0.5])],
        [v2.ToDtype({tv_tensors.Image: torch.float32, "others": None}, scale=True)],
        [v2.RandomHorizontalFlip(), v2.ColorJitter(0.1)],
    ],
)
def test_unusual_tails_run_step_by_step(steps: list[object]) -> None:
    assert fuse_tail(steps) is None


class _Flip(v2.RandomHorizontalFlip):
    """A subclass may change what the step does: never fused."""


def test_subclasses_are_not_fused() -> None:
    assert fuse_tail([_Flip()]) is None


def _exact_window(data: bytes, top: int, left: int, height: int, width: int) -> np.ndarray:
    """What a crop-window decoder must return: the full decode, cropped."""
    pixels = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    return pixels[top : top + height, left : left + width]


def test_crop_window_path_matches_generic_path(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def window(data: bytes, *box: int) -> np.ndarray:
        calls.append(box)
        return _exact_window(data, *box)

    monkeypatch.setattr(jpegcrop, "decode_window", window)
    transform = _normalized()
    decoder = crop_decoder_for(transform, "pil")
    assert decoder is not None
    for seed in range(6):
        data = _photo(400, 300, seed)
        torch.manual_seed(seed)
        slow = transform(decode_image(data, "jpg", "pil"))
        torch.manual_seed(seed)
        fast = decoder(data, "jpg")
        assert (fast - slow).abs().mean() < 0.02 / min(STD), f"seed {seed}"
    assert len(calls) >= 3  # crops of 4x the output or more take the 1/4 DCT scale instead


def test_crop_window_failure_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jpegcrop, "decode_window", lambda *args: None)
    decoder = crop_decoder_for(_normalized(224), "rgb8")  # no DCT scaling: same full decode
    assert decoder is not None
    data = _photo(400, 300, 1)
    torch.manual_seed(0)
    fallback = decoder(data, "jpg")
    monkeypatch.setattr(jpegcrop, "decode_window", _exact_window)
    torch.manual_seed(0)
    torch.testing.assert_close(decoder(data, "jpg"), fallback, rtol=0, atol=1e-5)


def test_crop_window_is_not_used_for_grey_jpegs(monkeypatch: pytest.MonkeyPatch) -> None:
    def window(*args: object) -> None:
        raise AssertionError("grey JPEGs are decoded by Pillow")

    monkeypatch.setattr(jpegcrop, "decode_window", window)
    buffer = io.BytesIO()
    Image.fromarray(np.full((60, 80), 90, np.uint8), "L").save(buffer, format="JPEG")
    decoder = crop_decoder_for(_normalized(), "pil")
    assert decoder is not None
    assert decoder(buffer.getvalue(), "jpg").shape == (3, 64, 64)


needs_window_decoder = pytest.mark.skipif(
    not jpegcrop.is_available(), reason="nvidia-nvimgcodec (shardstream[fastjpeg]) not installed"
)


@needs_window_decoder
@pytest.mark.parametrize("subsampling", [0, 1, 2])
@pytest.mark.parametrize("progressive", [False, True])
def test_window_decode_equals_full_decode(subsampling: int, progressive: bool) -> None:
    rng = np.random.default_rng(subsampling)
    pixels = rng.integers(0, 256, (131, 203, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(
        buffer, format="JPEG", quality=90, subsampling=subsampling, progressive=progressive
    )
    data = buffer.getvalue()
    for _ in range(40):
        height, width = int(rng.integers(1, 132)), int(rng.integers(16, 204))
        top, left = int(rng.integers(0, 132 - height)), int(rng.integers(0, 204 - width))
        window = jpegcrop.decode_window(data, top, left, height, width)
        assert window is not None
        np.testing.assert_array_equal(
            np.asarray(window), _exact_window(data, top, left, height, width)
        )


@needs_window_decoder
def test_window_decode_refuses_what_it_cannot_match() -> None:
    data = _photo(120, 90, 0)
    assert jpegcrop.decode_window(data, 0, 0, 10, 15) is None  # narrow: no fancy upsampling
    assert jpegcrop.decode_window(data, 0, 0, 100, 50) is None  # outside the image
    assert jpegcrop.decode_window(data[: len(data) // 2], 0, 0, 80, 100) is None  # truncated
    assert jpegcrop.decode_window(b"\xff\xd8 not a jpeg", 0, 0, 20, 20) is None


@needs_window_decoder
def test_window_decoder_is_silent_and_fork_safe() -> None:
    """Importing nvImageCodec without the nvJPEG wheels prints to stderr; the library must not."""
    code = (
        "import os\n"
        "from shardstream.streaming._decoding import fastcrop as jpegcrop\n"
        "from tests.streaming.test_fastcrop import _photo\n"
        "data = _photo(120, 90, 0)\n"
        "assert jpegcrop.decode_window(b'\\xff\\xd8 junk', 0, 0, 20, 20) is None\n"
        "assert jpegcrop.decode_window(data[:400], 0, 0, 80, 100) is None\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os._exit(0 if jpegcrop.decode_window(data, 5, 5, 40, 40) is not None else 3)\n"
        "assert os.waitpid(pid, 0)[1] == 0\n"
        "assert jpegcrop.decode_window(data, 5, 5, 40, 40) is not None\n"
    )
    root = pathlib.Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == ""


def test_a_compose_of_the_crop_alone_decodes() -> None:
    """Compose([RandomResizedCrop]) leaves no steps after the crop (v2.Compose refuses an empty
    list: making the decoder failed with 'Pass at least one transform')."""
    transform = v2.Compose([v2.RandomResizedCrop(24, antialias=True)])
    decoder = crop_decoder_for(transform, "rgb8")
    assert decoder is not None
    png = io.BytesIO()
    Image.new("RGB", (40, 30), (10, 200, 30)).save(png, format="PNG")
    for data, extension in ((_photo(64, 48, 1), "jpg"), (png.getvalue(), "png")):
        image = decoder(data, extension)
        assert tuple(image.shape) == (3, 24, 24) and image.dtype == torch.uint8
