"""GpuDecode without a GPU: the API, the drawn crops, pixels, corrupt images, stream ordering.

Everything but the CUDA kernels runs here: ``GpuDecode(device="cpu")`` runs the same stage
(encoded batches from real DataLoader workers, the drawn parameters, crop/resize/finish, the
Pillow fallback, the stream-ordering protocol through :class:`HostOrder`) on the CPU, and is
compared with the CPU path (``decode="rgb8"``) for the same seeds. The CUDA half is in
``test_gpu_decode_cuda.py``.
"""

from __future__ import annotations

import io
import logging
import pathlib
import pickle
from typing import ClassVar

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional

from shardstream import build_shards
from shardstream.errors import ConfigError, DecodeError
from shardstream.streaming import (
    RandomAccessDataset,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
)
from shardstream.streaming._decoding.encoded import (
    EncodedBatch,
    crop_draw_for,
    flat_bytes,
)
from shardstream.streaming._decoding.gpubackends import HostBackend, make_backend
from shardstream.streaming._decoding.gpudecode import (
    GpuDecode,
    HostOrder,
    Retirements,
    resolve_gpu_decode,
)
from tests.conftest import encode_image, write_image_folder
from tests.streaming.conformance import assert_loader_resumes
from tests.streaming.shards import make_dataset

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _crop_flip(size: int = 32) -> v2.Compose:
    """Output stays uint8: the stage's and the CPU path's pixels compare in whole levels."""
    return v2.Compose([v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()])


def _train(size: int = 32) -> v2.Compose:
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.PILToTensor(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(MEAN, STD),
        ]
    )


@pytest.fixture
def jpeg_dataset(tmp_path: pathlib.Path) -> pathlib.Path:
    """60 real images (every fourth a PNG) of 48x40 in 3 classes, 8 per shard."""
    write_image_folder(tmp_path / "images", num_classes=3, per_class=20, size=(48, 40), png_every=4)
    build_shards(tmp_path / "images", tmp_path / "ds", max_samples_per_shard=8)
    return tmp_path / "ds"


def _epoch(root: pathlib.Path, decode: object, transform: object, workers: int, **kw: object):
    dataset = StreamingDataset(
        root,
        batch_size=8,
        transform=transform,
        decode=decode,
        seed=3,
        **kw,  # type: ignore[arg-type]
    )
    torch.manual_seed(0)  # the workers' seeds, so both paths draw the same crops
    loader = StreamingDataLoader(dataset, num_workers=workers)
    return dataset, list(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_stage_on_cpu_matches_cpu_path_for_the_same_draws(
    jpeg_dataset: pathlib.Path, workers: int
) -> None:
    _, expected = _epoch(jpeg_dataset, "rgb8", _crop_flip(), workers)
    dataset, got = _epoch(jpeg_dataset, GpuDecode(device="cpu"), _crop_flip(), workers)
    assert len(got) == len(expected) == 8
    for (images, labels), (want, want_labels) in zip(got, expected, strict=True):
        assert images.dtype == torch.uint8 and images.shape == want.shape
        assert torch.equal(labels, want_labels)
        # Same crop and flip: only the resize's rounding may differ (float vs uint8 kernels).
        assert (images.int() - want.int()).abs().max() <= 1
    assert dataset.gpu_decode is not None
    stats = dataset.gpu_decode.stats()
    assert stats["images"] == 60 and stats["batches"] == 8 and stats["backend"] == "cpu"


def test_normalised_output_matches_cpu_path(jpeg_dataset: pathlib.Path) -> None:
    _, expected = _epoch(jpeg_dataset, "pil", _train(), 2)
    _, got = _epoch(jpeg_dataset, GpuDecode(device="cpu"), _train(), 2)
    one_level = 1 / 255 / min(STD)
    for (images, _), (want, _) in zip(got, expected, strict=True):
        assert images.dtype == torch.float32 and images.is_contiguous()
        assert (images - want).abs().max() <= one_level + 1e-5


def _photo(width: int, height: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    waves = [
        np.sin(x / width * rng.uniform(2, 9) + rng.uniform(0, 6)) * np.cos(y / 40) for _ in "rgb"
    ]
    pixels = (128 + 100 * np.stack(waves, axis=-1)).clip(0, 255).astype(np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buffer, format="JPEG", quality=92)
    return buffer.getvalue()


def _encoded(blobs: list[bytes], transform: v2.Compose, keys: list[str] | None = None):
    draw = crop_draw_for(transform)
    assert draw is not None
    rows = [draw(blob, "jpg").params for blob in blobs]
    views = [torch.frombuffer(bytearray(blob), dtype=torch.uint8) for blob in blobs]
    keys = keys or [f"k{i}" for i in range(len(blobs))]
    params = torch.tensor(rows, dtype=torch.int32)
    return EncodedBatch(views, params, keys, ["shard-000.tar"] * len(blobs), draw.recipe), rows


def test_pixels_match_decode_then_resized_crop_for_any_crop() -> None:
    """Up- and downscaled crops of several sizes against torchvision's generic path."""
    torch.manual_seed(1)
    blobs = [
        _photo(w, h, seed) for seed, (w, h) in enumerate([(300, 200), (97, 131), (640, 480)] * 4)
    ]
    for size in (24, 224):
        batch, rows = _encoded(blobs, _crop_flip(size))
        got = GpuDecode(device="cpu")(batch)
        for image, blob, row in zip(got, blobs, rows, strict=True):
            full = torch.from_numpy(np.asarray(Image.open(io.BytesIO(blob)).convert("RGB")).copy())
            want = functional.resized_crop(
                full.permute(2, 0, 1), *row[:4], [size, size], antialias=True
            )
            want = want.flip(-1) if row[4] else want
            assert (image.int() - want.int()).abs().max() <= 1


def test_drawn_parameters_follow_the_transform() -> None:
    """Crops lie in the image, flips follow the RNG, and both follow the seed."""
    transform = v2.Compose(
        [v2.RandomResizedCrop(16, scale=(0.2, 0.5), antialias=True), v2.RandomVerticalFlip(0.5)]
    )
    draw = crop_draw_for(transform)
    assert draw is not None
    blob = encode_image(64, 48, seed=0)
    torch.manual_seed(7)
    rows = [draw(blob, "jpg").params for _ in range(200)]
    torch.manual_seed(7)
    assert [draw(blob, "jpg").params for _ in range(200)] == rows
    for top, left, height, width, hflip, _, image_height, image_width, pixels in rows:
        assert (image_height, image_width) == (48, 64) and pixels == 0  # encoded, not pixels
        assert top >= 0 and top + height <= 48 and left >= 0 and left + width <= 64
        assert 0.2 * 64 * 48 * 0.9 <= height * width <= 0.5 * 64 * 48 * 1.1
        assert hflip == 0
    assert 60 < sum(row[5] for row in rows) < 140  # p = 0.5 vertical flips


def test_unrecognised_transforms_run_per_image_and_no_transform_keeps_whole_images(
    jpeg_dataset: pathlib.Path,
) -> None:
    jitter = v2.Compose([v2.ColorJitter(brightness=0.5), v2.CenterCrop(16)])
    _, batches = _epoch(jpeg_dataset, GpuDecode(device="cpu"), jitter, 0)
    assert all(images.shape == (8, 3, 16, 16) for images, _ in batches[:-1])
    _, whole = _epoch(jpeg_dataset, GpuDecode(device="cpu"), None, 0)
    images, labels = whole[0]
    assert images.shape == (8, 3, 40, 48) and images.dtype == torch.uint8
    assert len(labels) == 8


def test_dict_output_and_single_samples(jpeg_dataset: pathlib.Path) -> None:
    options = StreamOptions(output="dict")
    dataset = StreamingDataset(
        jpeg_dataset,
        batch_size=8,
        transform=_train(),
        decode=GpuDecode(device="cpu"),
        options=options,
    )
    batch = next(iter(StreamingDataLoader(dataset, num_workers=1)))
    assert batch["image"].shape == (8, 3, 32, 32) and batch["label"].shape == (8,)
    assert len(batch["__key__"]) == 8
    single = StreamingDataset(jpeg_dataset, transform=_train(), decode=GpuDecode(device="cpu"))
    image, label = next(iter(StreamingDataLoader(single, num_workers=1)))
    assert image.shape == (3, 32, 32) and isinstance(label, int)


def _corrupt_dataset(tmp_path: pathlib.Path) -> pathlib.Path:
    """16 JPEGs; sample 5's bytes cut in half (its header still opens), sample 11's scrambled."""
    samples = []
    for index in range(16):
        data = encode_image(48, 40, seed=index)
        if index == 5:
            data = data[: len(data) // 2]
        elif index == 11:
            data = data[:200] + bytes(range(256)) * 4
        samples.append({"__key__": f"s{index:02d}", "jpg": data, "cls": index})
    build_shards(samples, tmp_path / "bad", max_samples_per_shard=16, shuffle=False)
    return tmp_path / "bad"


def test_corrupt_images_raise_naming_shard_and_key(tmp_path: pathlib.Path) -> None:
    root = _corrupt_dataset(tmp_path)
    dataset = StreamingDataset(
        root, batch_size=16, shuffle=False, transform=_crop_flip(), decode=GpuDecode(device="cpu")
    )
    with pytest.raises(DecodeError, match=r"shard-000000\.tar: key 's05'.*on_error='skip'"):
        next(iter(StreamingDataLoader(dataset, num_workers=1)))


def test_corrupt_images_skipped_and_counted(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = _corrupt_dataset(tmp_path)
    dataset = StreamingDataset(
        root,
        batch_size=16,
        shuffle=False,
        transform=_crop_flip(),
        decode=GpuDecode(device="cpu"),
        on_error="skip",
    )
    with caplog.at_level(logging.WARNING, "shardstream.streaming"):
        ((images, labels),) = list(StreamingDataLoader(dataset, num_workers=1))
    assert images.shape[0] == 14
    assert labels.tolist() == [i for i in range(16) if i not in (5, 11)]
    assert dataset.gpu_decode is not None
    assert dataset.gpu_decode.stats()["skipped"] == 2
    assert sum("skipping sample" in record.message for record in caplog.records) == 2


class _RejectsOdd(HostBackend):
    """A device decoder that cannot decode every other image (as nvJPEG rejects CMYK)."""

    def decode(self, blobs: list, stream: object = None) -> list:
        decoded = super().decode(blobs, stream)
        return [None if i % 2 else image for i, image in enumerate(decoded)]


def test_skipped_images_leave_dict_batches_consistent(tmp_path: pathlib.Path) -> None:
    root = _corrupt_dataset(tmp_path)
    dataset = StreamingDataset(
        root,
        batch_size=16,
        shuffle=False,
        transform=_crop_flip(),
        decode=GpuDecode(device="cpu"),
        on_error="skip",
        options=StreamOptions(output="dict"),
    )
    (batch,) = list(StreamingDataLoader(dataset, num_workers=1))
    kept = [f"s{i:02d}" for i in range(16) if i not in (5, 11)]
    assert batch["__key__"] == kept and batch["label"].tolist() == [int(k[1:]) for k in kept]
    assert batch["image"].shape[0] == 14


def test_work_enqueued_before_an_error_keeps_its_buffers(tmp_path: pathlib.Path) -> None:
    """A corrupt image raising halfway through a batch: the parts already enqueued still
    read the decoder's buffers, so they are retired with an event, not dropped."""

    class Busy(HostOrder):
        def done(self, event: int) -> bool:
            return False  # the device has not finished anything yet

    root = _corrupt_dataset(tmp_path)
    dataset = StreamingDataset(
        root, batch_size=16, shuffle=False, transform=_crop_flip(), decode=GpuDecode(device="cpu")
    )
    stage = dataset.gpu_decode
    assert stage is not None
    run = stage._run()
    run.order = Busy()
    run.retired = Retirements(run.order)
    raw = next(iter(torch.utils.data.DataLoader(dataset, batch_size=None)))
    with pytest.raises(DecodeError):
        stage(raw)
    assert len(run.retired) >= 2  # the encoded batch and its bytes, until the event completes
    assert ("record", 1) in run.order.log


def test_device_decoder_rejections_fall_back_to_pillow() -> None:
    torch.manual_seed(2)
    blobs = [_photo(120, 90, seed) for seed in range(6)]
    batch, _ = _encoded(blobs, _crop_flip())
    expected = GpuDecode(device="cpu")(batch)
    stage = GpuDecode(device="cpu")
    stage._run().backend = _RejectsOdd()
    assert torch.equal(stage(batch), expected)
    assert stage.stats()["pillow"] == 3


def test_stream_order_protocol_one_batch_ahead(jpeg_dataset: pathlib.Path) -> None:
    """Each batch: its work inside the side stream, an event after it, and only when handed
    out a wait on that event and a hand-over of every tensor; batch i+1 is enqueued first."""
    dataset = StreamingDataset(
        jpeg_dataset,
        batch_size=8,
        transform=_train(),
        decode=GpuDecode(device="cpu", ahead=0),  # on the calling thread: a fixed order
        shuffle=False,
    )
    stage = dataset.gpu_decode
    assert stage is not None
    raw = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0))
    order = stage._run().order
    assert isinstance(order, HostOrder)
    handed = []
    for index, (images, _) in enumerate(stage.batches(raw)):
        handed.append((index, id(images)))
        log = [entry for entry in order.log if entry[0] != "side"]
        records = [value for name, value in log if name == "record"]
        waits = [value for name, value in log if name == "wait"]
        assert waits[-1] == index + 1  # the event of this batch
        if index + 1 < len(raw):
            assert records[-1] == index + 2, "the next batch is enqueued before this one leaves"
        assert ("hand_over", id(images)) in log
    assert len(handed) == len(raw)


def test_retirements_release_only_finished_work() -> None:
    class Pending(HostOrder):
        finished: ClassVar[set[int]] = set()

        def done(self, event: int) -> bool:
            return event in self.finished

    order = Pending()
    retired = Retirements(order)
    retired.retire(1, ["a", "b"])
    retired.retire(2, ["c"])
    assert len(retired) == 3
    order.finished.add(2)  # a later event done first: the older one still holds its objects
    retired.release_done()
    assert len(retired) == 3
    order.finished.add(1)
    retired.release_done()
    assert len(retired) == 0
    retired.retire(3, ["d"])
    retired.release_all()
    assert len(retired) == 0 and ("finish", 3) in order.log


def test_resume_is_exact_with_batches_decoded_ahead(tmp_path: pathlib.Path) -> None:
    """The stage pulls one batch ahead; the state counts only batches handed out."""
    root, _ = make_dataset(tmp_path, 45, 7)
    options = StreamOptions(output="dict", num_open=3, piece_size=3, block_size=4)

    def make() -> StreamingDataLoader:
        dataset = StreamingDataset(
            root,
            seed=5,
            batch_size=3,
            options=options,
            transform=_crop_flip(8),
            decode=GpuDecode(device="cpu"),
        )
        return StreamingDataLoader(dataset, num_workers=2, persistent_workers=True)

    assert_loader_resumes(make, key=lambda batch: tuple(batch["__key__"]), seed=3)


def test_without_cuda_decode_cuda_falls_back_to_the_workers(
    jpeg_dataset: pathlib.Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with caplog.at_level(logging.WARNING, "shardstream.streaming"):
        _, got = _epoch(jpeg_dataset, "cuda", _crop_flip(), 2)
    _, expected = _epoch(jpeg_dataset, "rgb8", _crop_flip(), 2)
    assert "no CUDA device here" in caplog.text
    for (images, labels), (want, want_labels) in zip(got, expected, strict=True):
        assert torch.equal(images, want) and torch.equal(labels, want_labels)
    worker_decode, stage = resolve_gpu_decode("cuda", _crop_flip(), "raise")
    assert (worker_decode, stage) == ("rgb8", None)


def test_configuration_errors(jpeg_dataset: pathlib.Path) -> None:
    with pytest.raises(ConfigError, match="backend must be one of"):
        GpuDecode(backend="magic")
    with pytest.raises(ConfigError, match="on_error"):
        GpuDecode(on_error="ignore")
    with pytest.raises(ConfigError, match="'cuda', 'cuda:N' or 'cpu'"):
        GpuDecode(device="tpu")
    with pytest.raises(ConfigError, match="max_images"):
        GpuDecode(max_images=0)
    with pytest.raises(ConfigError, match="decodes on the CPU"):
        make_backend("cpu", torch.device("cuda", 0), 1)
    with pytest.raises(ConfigError, match="RandomAccessDataset decodes where it is indexed"):
        RandomAccessDataset(jpeg_dataset, decode="cuda")


def test_stage_pickles_without_its_device_state(jpeg_dataset: pathlib.Path) -> None:
    stage = GpuDecode(device="cpu", max_images=3)
    batch, _ = _encoded([_photo(64, 48, 0)] * 5, _crop_flip())
    first = stage(batch)
    copy = pickle.loads(pickle.dumps(stage))
    assert copy == stage and "_device_run" not in copy.__dict__
    assert torch.equal(copy(batch), first)  # decoded in parts of 3, same pixels


def test_flat_bytes_is_a_view_of_packed_views() -> None:
    buffer = torch.arange(10, dtype=torch.uint8)
    views = list(buffer[1:9].split([3, 0, 5]))
    flat, sizes = flat_bytes(views)
    assert sizes == [3, 0, 5] and flat.data_ptr() == buffer[1:].data_ptr() and len(flat) == 8
    apart = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3], dtype=torch.uint8)]
    flat, sizes = flat_bytes(apart)
    assert flat.tolist() == [1, 2, 3] and sizes == [2, 1]
