"""The RandomResizedCrop fast path agrees with the generic decode-then-transform path."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from shardstream.streaming.decode import decode_image
from shardstream.streaming.fastcrop import crop_decoder_for
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
