"""Pixel shards through the GPU stage, run on the CPU (``GpuDecode(device="cpu")``).

The workers draw each crop and flip as the CPU path does and hand over only the crop's pixels;
the stage stages a batch in one buffer, moves it in one copy, then crops, resizes and flips the
whole batch in a few operations (:func:`~shardstream.streaming._decoding.gpubackends.
resize_pixels_into`). Compared here with ``decode="rgb8"`` on the same shards and seeds. The
CUDA half is in ``test_gpu_decode_cuda.py``.
"""

from __future__ import annotations

import pathlib
import tarfile

import numpy as np
import pytest
import torch
from torch.profiler import ProfilerActivity, profile
from torchvision import tv_tensors
from torchvision.transforms import v2

from shardstream import (
    DecodeError,
    GpuDecode,
    Stream,
    StreamingDataLoader,
    StreamingDataset,
    build_shards,
)
from shardstream._format.codecs import encode_pixels
from shardstream.streaming import StreamOptions
from shardstream.streaming._decoding import gpubackends
from shardstream.streaming._decoding.encoded import EncodedBatch, crop_draw_for
from shardstream.streaming._decoding.fastcrop import crop_decoder_for
from tests.conftest import encode_image
from tests.streaming.conformance import assert_loader_resumes
from tests.streaming.test_fastcrop import _photo
from tests.streaming.test_pixels import (
    _members,
    _stored,
    build_pixel_dataset,
    train_transform,
    write_folder,
)

DICT = StreamOptions(output="dict")
ONE_LEVEL = 1 / 255 / 0.224  # one uint8 level after ImageNet's Normalize (its smallest std)


def _crop_flips(size: int = 16) -> v2.Compose:
    """uint8 out, both flips at p=0.5: the stage's and the CPU path's pixels compare in levels."""
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, scale=(0.05, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.RandomVerticalFlip(),
        ]
    )


@pytest.fixture(scope="module")
def pixel_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_pixel_dataset(tmp_path_factory.mktemp("gpupixels"))


def _epoch(source: object, decode: object, transform: object, workers: int, **kw: object) -> list:
    dataset = StreamingDataset(
        source,  # type: ignore[arg-type]
        batch_size=4,
        seed=3,
        decode=decode,  # type: ignore[arg-type]
        transform=transform,  # type: ignore[arg-type]
        options=DICT,
        **kw,  # type: ignore[arg-type]
    )
    torch.manual_seed(0)  # the workers' seeds: both paths draw the same crops
    return list(StreamingDataLoader(dataset, num_workers=workers))


@pytest.mark.parametrize(("workers", "transform"), [(2, _crop_flips()), (0, train_transform())])
def test_same_samples_labels_order_and_crops_as_the_cpu_path(
    pixel_dataset: str, workers: int, transform: v2.Compose
) -> None:
    expected = _epoch(pixel_dataset, "rgb8", transform, workers)
    got = _epoch(pixel_dataset, GpuDecode(device="cpu"), transform, workers)
    assert len(got) == len(expected) == 6
    for batch, want in zip(got, expected, strict=True):
        assert batch["__key__"] == want["__key__"]
        assert torch.equal(batch["label"], want["label"])
        images = batch["image"]
        assert images.shape == want["image"].shape and images.dtype == want["image"].dtype
        assert images.is_contiguous()
        if images.dtype == torch.uint8:  # the resize's rounding: float here, uint8 there
            assert (images.int() - want["image"].int()).abs().max() <= 1
        else:
            assert (images - want["image"]).abs().max() <= ONE_LEVEL + 1e-5


def _pixel_batch(count: int, size: tuple[int, int], seed: int = 0) -> tuple[EncodedBatch, list]:
    """``count`` pixel members of random sides 20-300 (crops up- and downscaled), their crops
    drawn by the workers' code; and the CPU path's outputs for the same draws."""
    rng = np.random.default_rng(seed)
    transform = v2.Compose(
        [
            v2.RandomResizedCrop(size, scale=(0.02, 1.0), antialias=True),
            v2.RandomHorizontalFlip(),
            v2.RandomVerticalFlip(),
        ]
    )
    draw, cpu = crop_draw_for(transform), crop_decoder_for(transform, "rgb8")
    assert draw is not None and cpu is not None
    members = [
        encode_pixels(rng.integers(0, 256, (*rng.integers(20, 300, 2), 3), dtype=np.uint8))
        for _ in range(count)
    ]
    torch.manual_seed(seed)
    drawn = [draw(member, "pixels.npy") for member in members]
    after_draw = torch.rand(1)
    torch.manual_seed(seed)
    expected = [cpu(member, "pixels.npy") for member in members]
    assert torch.equal(torch.rand(1), after_draw)  # the same RNG draws, in the same number
    packed = torch.frombuffer(
        bytearray(b"".join(encoded.data for encoded in drawn)), dtype=torch.uint8
    )
    views = list(packed.split([len(encoded.data) for encoded in drawn]))  # as workers pack them
    params = torch.tensor([encoded.params for encoded in drawn], dtype=torch.int32)
    keys = [f"k{i}" for i in range(count)]
    return EncodedBatch(views, params, keys, ["s.tar"] * count, draw.recipe), expected


@pytest.mark.parametrize("size", [(16, 16), (48, 64), (96, 96)])
def test_crops_equal_the_cpu_paths_crops_for_the_same_draws(size: tuple[int, int]) -> None:
    batch, expected = _pixel_batch(24, size)
    rows = batch.params.numpy()
    assert rows[:, -1].tolist() == [1] * 24  # marked as pixel crops
    assert all(
        len(image) == h * w * 3 for image, (h, w) in zip(batch.images, rows[:, 2:4], strict=True)
    )
    got = GpuDecode(device="cpu", max_images=7)(batch)  # in parts of 7: 4 parts
    assert got.shape == (24, 3, *size) and got.dtype == torch.uint8
    difference = (got.int() - torch.stack(expected).int()).abs()
    assert difference.max() <= 1 and difference.float().mean() < 0.3
    # Before rounding: torch's float antialiased kernel on each crop, then its flips.
    staged = gpubackends.stage_pixels(batch.images, rows, batch.recipe, 7, torch.device("cpu"))
    out = torch.empty(24, 3, *size)
    gpubackends.resize_pixels_into(out, staged, staged.buffer)
    for index, (image, row) in enumerate(zip(batch.images, rows, strict=True)):
        crop = image.view(int(row[2]), int(row[3]), 3).permute(2, 0, 1)[None].float()
        want = torch.nn.functional.interpolate(crop, size=list(size), mode="bilinear",
                                               antialias=True, align_corners=False)[0]  # fmt: skip
        want = want.flip(-1) if row[4] else want
        want = want.flip(-2) if row[5] else want
        torch.testing.assert_close(out[index], want, atol=0.02, rtol=0)


def test_one_staging_copy_per_batch_of_only_the_crops(
    pixel_dataset: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    copies: list[int] = []
    staged: list[tuple[int, int]] = []
    to_device, stage = gpubackends.to_device, gpubackends.stage_pixels

    def counting_copy(buffer: torch.Tensor, device: torch.device) -> torch.Tensor:
        copies.append(buffer.numel())
        return to_device(buffer, device)

    def recording_stage(crops, rows, *args):  # type: ignore[no-untyped-def]
        result = stage(crops, rows, *args)
        staged.append((int((rows[:, 2] * rows[:, 3] * 3).sum()), result.pixels_at))
        return result

    monkeypatch.setattr(gpubackends, "to_device", counting_copy)
    monkeypatch.setattr(gpubackends, "stage_pixels", recording_stage)
    dataset = StreamingDataset(pixel_dataset, batch_size=4, decode=GpuDecode(device="cpu"),
                               transform=train_transform(), options=DICT)  # fmt: skip
    batches = list(StreamingDataLoader(dataset, num_workers=2))
    assert len(batches) == len(copies) == len(staged) == 6  # one copy per batch, no other
    whole = sum(_stored(member).nbytes for member in _members(pixel_dataset).values())
    crops = sum(pixel_bytes for pixel_bytes, _ in staged)
    assert crops < whole  # only the crops' pixels travel
    for size, (pixel_bytes, tables_bytes) in zip(copies, staged, strict=True):
        assert pixel_bytes + tables_bytes <= size <= pixel_bytes + tables_bytes + 3 * 64
    assert dataset.gpu_decode is not None
    stats = dataset.gpu_decode.stats()
    assert stats["pixels"] == stats["images"] == 24 and stats["pillow"] == 0


#: Operations that only make views, and ``fill_``, which ``zero_`` calls on larger CPU tensors.
_NO_WORK = {"as_strided", "view", "slice", "select", "permute", "transpose", "reshape", "detach",
            "resolve_conj", "resolve_neg", "alias", "_unsafe_view", "set_", "fill_"}  # fmt: skip


def _operations(batch: EncodedBatch, stage: GpuDecode) -> int:
    """ATen operations that do work (kernels on a device) in one call of the stage."""
    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        stage(batch)
    names = [event.name for event in recorded.events() if event.name.startswith("aten::")]
    return sum(name.removeprefix("aten::") not in _NO_WORK for name in names)


def test_device_operations_do_not_grow_with_the_batch() -> None:
    """A batch of 32 crops takes as many device operations as a batch of 4 (per part)."""
    stage = GpuDecode(device="cpu", max_images=64)
    stage(_pixel_batch(2, (32, 32))[0])  # first-use set-up
    small = _operations(_pixel_batch(4, (32, 32), seed=1)[0], stage)
    large = _operations(_pixel_batch(32, (32, 32), seed=2)[0], stage)
    assert small == large < 40, (small, large)
    # The JPEG path resizes image by image: its count grows with the batch (the measure works).
    draw = crop_draw_for(_crop_flips(32))
    assert draw is not None

    def jpegs(count: int) -> EncodedBatch:
        blobs = [_photo(60, 40, seed) for seed in range(count)]
        rows = [draw(blob, "jpg").params for blob in blobs]
        views = [torch.frombuffer(bytearray(blob), dtype=torch.uint8) for blob in blobs]
        params = torch.tensor(rows, dtype=torch.int32)
        return EncodedBatch(views, params, ["k"] * count, ["s"] * count, draw.recipe)

    assert _operations(jpegs(32), stage) > _operations(jpegs(4), stage) + 50


def test_flips_and_normalise_on_whole_images(tmp_path: pathlib.Path) -> None:
    """A fixed box and a crop of the whole image flipped both ways: each row is known."""
    build_shards(write_folder(tmp_path / "images", 12), tmp_path / "ds", pixels="32x24",
                 max_samples_per_shard=5)  # fmt: skip
    members = _members(str(tmp_path / "ds"))
    steps = train_transform().transforms
    whole = v2.RandomResizedCrop((24, 32), scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3), antialias=True)
    flips = [v2.RandomHorizontalFlip(p=1.0), v2.RandomVerticalFlip(p=1.0)]
    transform = v2.Compose([whole, *flips, *steps[2:]])
    seen = 0
    for batch in _epoch(str(tmp_path / "ds"), GpuDecode(device="cpu"), transform, 2):
        assert batch["image"].shape == (4, 3, 24, 32) and batch["image"].dtype == torch.float32
        for key, image in zip(batch["__key__"], batch["image"], strict=True):
            stored = tv_tensors.Image(torch.from_numpy(_stored(members[key])).permute(2, 0, 1))
            expected = transform(stored).as_subclass(torch.Tensor)
            torch.testing.assert_close(image, expected, atol=1e-5, rtol=0)
            seen += 1
    assert seen == 12


def test_no_transform_gives_the_stored_images(pixel_dataset: str, tmp_path: pathlib.Path) -> None:
    members = _members(pixel_dataset)
    for batch in _epoch(pixel_dataset, GpuDecode(device="cpu"), None, 2):
        assert isinstance(batch["image"], list)  # sides differ (short=24): a list, as for JPEGs
        for key, image in zip(batch["__key__"], batch["image"], strict=True):
            assert torch.equal(image, torch.from_numpy(_stored(members[key])).permute(2, 0, 1))
    build_shards(write_folder(tmp_path / "images", 8), tmp_path / "box", pixels="20x12")
    (batch, *_) = _epoch(str(tmp_path / "box"), GpuDecode(device="cpu"), None, 0)
    assert batch["image"].shape == (4, 3, 12, 20) and batch["image"].dtype == torch.uint8


def test_workers_read_exact_epochs_and_resume_mid_epoch(pixel_dataset: str) -> None:
    def make() -> StreamingDataLoader:
        stage = GpuDecode(device="cpu")
        dataset = StreamingDataset(pixel_dataset, batch_size=4, seed=3, options=DICT,
                                   decode=stage, transform=_crop_flips())  # fmt: skip
        return StreamingDataLoader(dataset, num_workers=2)

    loader = make()
    keys = sorted(_members(pixel_dataset))
    for _ in range(2):
        seen = [key for batch in loader for key in batch["__key__"]]
        assert sorted(seen) == keys  # every sample once per epoch
    assert_loader_resumes(make, key=lambda batch: tuple(batch["__key__"]), num_points=1)


def _damaged(tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
    """6 pixel samples in one shard: the first's dtype is not uint8, the third's shape is not
    what its bytes hold."""
    root = tmp_path / "damaged"
    build_shards(write_folder(tmp_path / "images", 6), root, pixels="short=24", shuffle=False)
    shard = root / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    first = data.index(b"'descr': '|u1'")
    data[first : first + 14] = b"'descr': '<f8'"
    third = [i for i in range(len(data)) if data.startswith(b"'shape': (", i)][2]
    data[third + 10 : third + 12] = b"99" if data[third + 10 : third + 12] != b"99" else b"98"
    shard.write_bytes(bytes(data))
    with tarfile.open(shard) as archive:
        keys = [member.name.partition(".")[0] for member in archive if "pixels" in member.name]
    return root, keys


def test_damaged_members_raise_or_skip_as_on_the_cpu_path(tmp_path: pathlib.Path) -> None:
    root, keys = _damaged(tmp_path)
    errors = []
    for decode in ("rgb8", GpuDecode(device="cpu")):
        dataset = StreamingDataset(str(root), batch_size=3, shuffle=False, decode=decode,
                                   transform=train_transform())  # fmt: skip
        with pytest.raises(DecodeError) as raised:
            list(StreamingDataLoader(dataset, num_workers=1))
        errors.append(str(raised.value))
    assert errors[0] == errors[1]
    assert f"key '{keys[0]}'" in errors[1] and "pixels.npy" in errors[1]
    kept = []
    for decode in ("rgb8", GpuDecode(device="cpu")):
        dataset = StreamingDataset(str(root), batch_size=3, shuffle=False, decode=decode,
                                   transform=train_transform(), on_error="skip",
                                   options=DICT)  # fmt: skip
        batches = list(StreamingDataLoader(dataset, num_workers=1))
        kept.append([key for batch in batches for key in batch["__key__"]])
    assert kept[0] == kept[1] == [key for i, key in enumerate(keys) if i not in (0, 2)]


def test_jpeg_and_pixel_shards_mixed_in_one_batch(
    pixel_dataset: str, tmp_path: pathlib.Path
) -> None:
    jpegs = tmp_path / "jpegs"
    build_shards(write_folder(tmp_path / "images", 12), jpegs, max_samples_per_shard=4)
    streams = [Stream(pixel_dataset, proportion=0.5), Stream(str(jpegs), proportion=0.5)]
    runs = [_epoch(streams, decode, _crop_flips(), 2, epoch_size=20)
            for decode in ("rgb8", GpuDecode(device="cpu"))]  # fmt: skip
    mixed = 0
    for want, batch in zip(*runs, strict=True):
        assert batch["__key__"] == want["__key__"] and torch.equal(batch["label"], want["label"])
        assert batch["image"].shape == (4, 3, 16, 16)
        assert (batch["image"].int() - want["image"].int()).abs().max() <= 1
        kinds = {url.startswith(pixel_dataset) for url in batch["__url__"]}
        mixed += len(kinds) == 2
    assert mixed >= 1  # some batches held both kinds


def test_a_mixed_batch_whose_jpegs_are_all_skipped_keeps_its_pixels() -> None:
    pixels, expected = _pixel_batch(2, (16, 16))
    draw = crop_draw_for(_crop_flips(16))
    assert draw is not None
    broken = [encode_image(48, 40, seed) for seed in (0, 2)]
    broken = [blob[: len(blob) // 2] for blob in broken]  # headers open, the data cut short
    rows = [draw(blob, "jpg").params for blob in broken] + pixels.params.tolist()
    blobs = [bytearray(blob) for blob in broken] + [
        bytearray(view.numpy()) for view in pixels.images
    ]
    views = [torch.frombuffer(blob, dtype=torch.uint8) for blob in blobs]
    keys = ["j0", "j1", "p0", "p1"]
    batch = EncodedBatch(views, torch.tensor(rows, dtype=torch.int32), keys, ["s"] * 4, draw.recipe)
    stage = GpuDecode(device="cpu", on_error="skip")
    images, keys_kept = stage((batch, keys))
    assert keys_kept == ["p0", "p1"] and images.shape == (2, 3, 16, 16)
    assert (images.int() - torch.stack(expected).int()).abs().max() <= 1
    assert stage.stats()["skipped"] == 2 and stage.stats()["pixels"] == 2
    with pytest.raises(DecodeError, match="all 2 images of one batch failed"):
        stage(
            (EncodedBatch(views[:2], batch.params[:2], keys[:2], ["s"] * 2, draw.recipe), keys[:2])
        )
