"""GpuDecode on a CUDA GPU: pixels against the CPU stage, stream ordering under a busy step,
pixel shards (one copy per batch, kernels that do not grow with the batch).

These need a CUDA device and are skipped without one (the CPU half, which tests everything but
the kernels, is ``test_gpu_decode.py``). Run on a GPU machine with
``python -m pytest tests/streaming/test_gpu_decode_cuda.py``.
"""

from __future__ import annotations

import io
import pathlib

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from shardstream import build_shards
from shardstream._format.codecs import encode_pixels
from shardstream.errors import ConfigError, DecodeError
from shardstream.streaming import StreamingDataLoader, StreamingDataset
from shardstream.streaming._decoding import gpubackends
from shardstream.streaming._decoding.encoded import EncodedBatch, crop_draw_for
from shardstream.streaming._decoding.gpudecode import GpuDecode
from tests.conftest import write_image_folder

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

BACKENDS = ["nvimgcodec", "torchvision"]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """A decoder backend this GPU has (nvImageCodec needs its hardware JPEG decoder)."""
    try:
        GpuDecode(backend=request.param)._run()
    except ConfigError as error:
        pytest.skip(f"{request.param} does not run on this GPU: {error}")
    return request.param


def _photo(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    waves = [
        np.sin(x / width * rng.uniform(2, 9) + rng.uniform(0, 6)) * np.cos(y / 50) for _ in "rgb"
    ]
    noise = rng.normal(0, 6, size=(height, width, 3))
    pixels = (128 + 100 * np.stack(waves, axis=-1) + noise).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def _batch(count: int, size: int = 224, seed: int = 0) -> EncodedBatch:
    transform = v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])
    draw = crop_draw_for(transform)
    assert draw is not None
    rng = np.random.default_rng(seed)
    blobs = [
        _photo(int(rng.integers(200, 640)), int(rng.integers(160, 480)), seed * 1000 + i)
        for i in range(count)
    ]
    torch.manual_seed(seed)
    rows = [draw(blob, "jpg").params for blob in blobs]
    views = [torch.frombuffer(bytearray(blob), dtype=torch.uint8) for blob in blobs]
    keys = [f"k{i}" for i in range(count)]
    params = torch.tensor(rows, dtype=torch.int32)
    return EncodedBatch(views, params, keys, ["shard.tar"] * count, draw.recipe)


def test_gpu_pixels_close_to_the_cpu_stage(backend: str) -> None:
    batch = _batch(48)
    got = GpuDecode(backend=backend)(batch)
    assert got.is_cuda and got.dtype == torch.uint8 and got.shape == (48, 3, 224, 224)
    want = GpuDecode(device="cpu")(batch)
    diff = (got.cpu().int() - want.int()).abs().float()
    # nvJPEG's IDCT differs from libjpeg-turbo's by a level or two; the crops are the same.
    assert diff.mean() < 1.0, f"mean |d| {diff.mean():.3f}"
    assert torch.quantile(diff.flatten()[:1_000_000], 0.999) <= 8


@pytest.mark.parametrize("ahead", [0, 2])
def test_batches_ahead_equal_synchronous_decodes_under_a_busy_step(
    backend: str, ahead: int
) -> None:
    """The training step's stream is kept busy and overwrites each batch after reading it: any
    missing wait or allocator reuse across streams (or, with ``ahead``, across the stage's
    thread and the training thread) shows up as different pixels."""
    batches = [_batch(32, size=128, seed=seed) for seed in range(6)]
    reference = [GpuDecode(backend=backend)(batch).clone() for batch in batches]
    torch.cuda.synchronize()
    stage = GpuDecode(backend=backend, ahead=ahead)
    weights = torch.randn(4096, 4096, device="cuda")
    sums = []
    for images in stage.batches(batches):
        for _ in range(8):  # a slow step on the current stream
            weights = torch.tanh(weights @ weights * 1e-3)
        sums.append(images.float().sum(dim=(1, 2, 3)))
        images.zero_()  # the step is done with them; their memory may now be reused
    torch.cuda.synchronize()
    for got, want in zip(sums, reference, strict=True):
        assert torch.equal(got, want.float().sum(dim=(1, 2, 3)))
    stage.close()


def test_corrupt_images_on_the_gpu_follow_the_cpu_rules() -> None:
    batch = _batch(8)
    cut = batch.images[3][: len(batch.images[3]) // 2].clone()
    batch.images[3] = cut
    with pytest.raises(DecodeError, match="key 'k3'"):
        GpuDecode()(batch)
    stage = GpuDecode(on_error="skip")
    images = stage(batch)
    assert images.shape[0] == 7 and stage.stats()["skipped"] == 1


def test_loader_end_to_end_on_the_gpu(tmp_path: pathlib.Path) -> None:
    write_image_folder(tmp_path / "img", num_classes=4, per_class=25, size=(160, 120), png_every=5)
    build_shards(tmp_path / "img", tmp_path / "ds", max_samples_per_shard=16)
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(64, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.5] * 3, [0.25] * 3),
        ]
    )
    datasets = {
        decode: StreamingDataset(
            tmp_path / "ds", batch_size=16, transform=transform, seed=4, decode=decode
        )
        for decode in ("cuda", "rgb8")
    }
    runs = {}
    for decode, dataset in datasets.items():
        torch.manual_seed(0)
        runs[decode] = list(StreamingDataLoader(dataset, num_workers=2))
    assert len(runs["cuda"]) == len(runs["rgb8"]) == 7
    for (images, labels), (want, want_labels) in zip(runs["cuda"], runs["rgb8"], strict=True):
        assert images.is_cuda and labels.is_cuda
        assert torch.equal(labels.cpu(), want_labels)
        assert (images.cpu() - want).abs().mean() < 4 / 255 / 0.25
    stats = datasets["cuda"].gpu_decode.stats()  # type: ignore[union-attr]
    assert stats["images"] == 100 and stats["pillow"] == 20  # the PNGs


def _pixel_loader(root: pathlib.Path, decode: object, transform: object) -> list:
    dataset = StreamingDataset(
        root,
        batch_size=16,
        transform=transform,
        seed=4,
        decode=decode,  # type: ignore[arg-type]
    )
    torch.manual_seed(0)  # the workers' seeds: the same crops drawn on every path
    return list(StreamingDataLoader(dataset, num_workers=2))


def test_pixel_shards_on_the_gpu_in_one_copy_per_batch(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_image_folder(tmp_path / "img", num_classes=4, per_class=25, size=(160, 120), png_every=5)
    build_shards(tmp_path / "img", tmp_path / "px", max_samples_per_shard=16, pixels="short=96")
    uint8 = v2.Compose(
        [
            v2.RandomResizedCrop(64, scale=(0.05, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.RandomVerticalFlip(),
        ]
    )
    copies: list[str] = []
    to_device = gpubackends.to_device

    def counting(buffer: torch.Tensor, device: torch.device) -> torch.Tensor:
        assert buffer.is_pinned()  # so the copy does not wait for the host
        copies.append(str(device))
        return to_device(buffer, device)

    monkeypatch.setattr(gpubackends, "to_device", counting)
    on_gpu = _pixel_loader(tmp_path / "px", "cuda", uint8)
    on_cpu = _pixel_loader(tmp_path / "px", "rgb8", uint8)
    assert len(on_gpu) == len(on_cpu) == len(copies) == 7  # one copy per batch
    for (images, labels), (want, want_labels) in zip(on_gpu, on_cpu, strict=True):
        assert images.is_cuda and images.dtype == torch.uint8 and images.shape == want.shape
        assert torch.equal(labels.cpu(), want_labels)
        # Float filters on the device against the CPU path's uint8 kernel: rounding only.
        assert (images.cpu().int() - want.int()).abs().max() <= 1


def test_pixel_batches_take_as_many_kernels_at_any_size() -> None:
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    transform = v2.Compose(
        [
            v2.RandomResizedCrop(224, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.5] * 3, [0.25] * 3),
        ]
    )
    draw = crop_draw_for(transform)
    assert draw is not None
    rng = np.random.default_rng(0)

    def batch(count: int) -> EncodedBatch:
        sides = [(256, int(rng.integers(256, 400)), 3) for _ in range(count)]
        members = [encode_pixels(rng.integers(0, 256, side, dtype=np.uint8)) for side in sides]
        drawn = [draw(member, "pixels.npy") for member in members]
        packed = torch.frombuffer(bytearray(b"".join(d.data for d in drawn)), dtype=torch.uint8)
        views = list(packed.split([len(d.data) for d in drawn]))
        params = torch.tensor([d.params for d in drawn], dtype=torch.int32)
        return EncodedBatch(views, params, ["k"] * count, ["s"] * count, draw.recipe)

    stage = GpuDecode(max_images=256)
    stage(batch(4))
    torch.cuda.synchronize()
    kernels = []
    for count in (16, 128):
        work = batch(count)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as recorded:
            images = stage(work)
            torch.cuda.synchronize()
        assert images.shape == (count, 3, 224, 224) and images.dtype == torch.float32
        kernels.append(sum(e.device_type == DeviceType.CUDA for e in recorded.events()))
    # 8x the images, the same kernels (cuBLAS may pick a split matrix product for other shapes)
    assert 0 < kernels[0] < 40 and abs(kernels[1] - kernels[0]) <= 2, kernels
