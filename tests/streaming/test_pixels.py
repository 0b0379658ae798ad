"""Pixel shards (``build --pixels``) read as images: crops drawn as for JPEGs, no decode, no copy,
and every reading feature (workers, resume, random access, views, mixtures) as for JPEG shards."""

from __future__ import annotations

import collections
import io
import json
import pathlib
import tarfile

import numpy as np
import pytest
import torch
import torch.distributed as dist
from PIL import Image
from torchvision import tv_tensors
from torchvision.transforms import v2

from shardstream import (
    DecodeError,
    RandomAccessDataset,
    Stream,
    StreamingDataLoader,
    StreamingDataset,
    StreamOptions,
    build_shards,
    make_view,
)
from shardstream._format.codecs import encode_pixels, pixel_array
from shardstream.streaming._decoding.fastcrop import (
    PendingImage,
    crop_decoder_for,
    decode_image,
    draw_crop_box,
    pixel_tensor,
    resize_pixel_crop,
)
from shardstream.streaming._options import stream_quotas
from shardstream.streaming._worker.batch import stack_or_list
from tests.conftest import encode_image
from tests.ddp import exit_rank_cleanly, spawn_ranks
from tests.streaming.conformance import assert_loader_resumes
from tests.streaming.test_fastcrop import _photo

SIZE = 16
SIZES = [(40, 30), (30, 44), (36, 36), (50, 28)]


def train_transform(size: int = SIZE) -> v2.Compose:
    return v2.Compose(
        [
            v2.RandomResizedCrop(size, antialias=True),
            v2.RandomHorizontalFlip(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ]
    )


def write_folder(root: pathlib.Path, num_images: int = 24, num_classes: int = 3) -> pathlib.Path:
    """An ImageFolder of real JPEGs and PNGs of several sizes and aspects."""
    for index in range(num_images):
        folder = root / f"class_{index % num_classes}"
        folder.mkdir(parents=True, exist_ok=True)
        fmt = "PNG" if index % 5 == 4 else "JPEG"
        data = encode_image(*SIZES[index % len(SIZES)], seed=index, fmt=fmt)
        (folder / f"img_{index:04d}.{fmt.lower().replace('jpeg', 'jpg')}").write_bytes(data)
    return root


def build_pixel_dataset(root: pathlib.Path) -> str:
    """The pixel dataset these tests share: 24 images of several sizes at short=24, 5 a shard."""
    build_shards(
        write_folder(root / "images"), root / "ds", pixels="short=24", max_samples_per_shard=5
    )
    return str(root / "ds")


@pytest.fixture(scope="module")
def pixel_dataset(tmp_path_factory: pytest.TempPathFactory) -> str:
    return build_pixel_dataset(tmp_path_factory.mktemp("pixels"))


def _members(dataset: str) -> dict[str, bytes]:
    """Every ``pixels.npy`` member of a dataset by key, read with the tarfile module."""
    members = {}
    for path in sorted(pathlib.Path(dataset).glob("shard-*.tar")):
        with tarfile.open(path) as archive:
            for member in archive:
                key, _, extension = member.name.partition(".")
                if extension == "pixels.npy":
                    members[key] = archive.extractfile(member).read()  # type: ignore[union-attr]
    return members


def _stored(member: bytes) -> np.ndarray:
    return np.load(io.BytesIO(member), allow_pickle=False)


def crop_pixels(crop: v2.RandomResizedCrop, out_size: tuple[int, int], member: object) -> object:
    """The CPU path's crop of a pixel member, unflipped: drawn, cut and resized."""
    array = pixel_array(member, "")
    return resize_pixel_crop(array, draw_crop_box(crop, *array.shape[:2]), out_size)[0]


def test_crops_are_drawn_as_the_jpeg_path_draws_them() -> None:
    transform = train_transform(48)
    decoder = crop_decoder_for(transform, "rgb8")
    assert decoder is not None
    for seed in range(8):
        jpeg = _photo(120, 90, seed)
        decoded = decode_image(jpeg, "jpg", "rgb8")  # (3, 90, 120)
        member = encode_pixels(decoded.permute(1, 2, 0).numpy())
        torch.manual_seed(seed)
        from_jpeg, after_jpeg = decoder(jpeg, "jpg"), torch.rand(1)
        torch.manual_seed(seed)
        from_pixels, after_pixels = decoder(member, "pixels.npy"), torch.rand(1)
        torch.manual_seed(seed)
        generic = transform(tv_tensors.Image(decoded))  # torchvision on the decoded image
        assert after_pixels == after_jpeg  # the same RNG draws, in the same number
        assert from_pixels.shape == from_jpeg.shape == (3, 48, 48)
        assert (from_pixels - from_jpeg).abs().mean() < 0.02, seed
        torch.testing.assert_close(from_pixels, generic.as_subclass(torch.Tensor))


@pytest.mark.parametrize("seed", range(4))
def test_the_crop_is_torchvisions_resized_crop_pixel_for_pixel(seed: int) -> None:
    rng = np.random.default_rng(seed)
    height, width = (int(side) for side in rng.integers(40, 300, 2))
    stored = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
    crop = v2.RandomResizedCrop((48, 64), scale=(0.02, 1.0), antialias=True)  # up and down
    member = memoryview(bytearray(encode_pixels(stored)))
    image = torch.from_numpy(stored).permute(2, 0, 1).contiguous()
    for draw in range(10):
        torch.manual_seed(draw)
        params = crop.make_params([image])
        torch.manual_seed(draw)
        ours = crop_pixels(crop, (48, 64), member)
        box = params["top"], params["left"], params["height"], params["width"]
        expected = v2.functional.resized_crop(image, *box, [48, 64], antialias=True)
        assert torch.equal(ours, expected), (seed, draw, box)


@pytest.mark.parametrize("out_side", [224, 48, 5])
def test_the_resize_commutes_with_flips_at_every_size(out_side: int) -> None:
    # The CPU path flips the crop before resizing it, a mirror as one reversal of each row's
    # bytes (channels last to first): the same pixels as flipping after, for every size.
    rng = np.random.default_rng(out_side)
    for side in range(1, 520):
        wide = rng.integers(0, 256, (2, side, 3), dtype=np.uint8)
        plain, reversed_channels = resize_pixel_crop(wide, (0, 0, 2, side), (2, out_side))
        mirrored, reversed_channels = resize_pixel_crop(
            wide, (0, 0, 2, side), (2, out_side), mirror=True
        )
        assert reversed_channels and torch.equal(mirrored.flip(0), plain.flip(-1)), side
        tall = rng.integers(0, 256, (side, 2, 3), dtype=np.uint8)
        plain, _ = resize_pixel_crop(tall, (0, 0, side, 2), (out_side, 2))
        upside_down, reversed_channels = resize_pixel_crop(
            tall, (0, 0, side, 2), (out_side, 2), upside_down=True
        )
        assert not reversed_channels and torch.equal(upside_down, plain.flip(-2)), side


@pytest.mark.parametrize("batched", [False, True])
def test_flipped_crops_are_torchvisions_to_the_bit(batched: bool) -> None:
    flips = [v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(), v2.RandomHorizontalFlip(0.3)]
    transform = v2.Compose([v2.RandomResizedCrop((20, 28), scale=(0.05, 1.0)), *flips])
    decoder = crop_decoder_for(transform, "rgb8", batched)
    assert decoder is not None
    rng = np.random.default_rng(0)
    stored = [rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8)
              for h, w in rng.integers(8, 90, (24, 2))]  # fmt: skip
    torch.manual_seed(3)
    ours = [decoder(encode_pixels(image), "pixels.npy") for image in stored]
    if batched:
        ours = list(stack_or_list(ours, True))
    torch.manual_seed(3)
    for image, got in zip(stored, ours, strict=True):
        expected = transform(tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1)))
        assert torch.equal(got, expected.as_subclass(torch.Tensor))


def test_pixels_are_read_in_place_and_never_handed_out_shared() -> None:
    stored = np.random.default_rng(0).integers(0, 256, (12, 20, 3), dtype=np.uint8)
    buffer = bytearray(encode_pixels(stored))
    view = pixel_tensor(memoryview(buffer))
    address = np.frombuffer(buffer, np.uint8).ctypes.data
    assert view.data_ptr() == address + 128  # a view of the reader's buffer: no copy
    assert torch.equal(view, torch.from_numpy(stored).permute(2, 0, 1))
    whole = v2.RandomResizedCrop((12, 20), scale=(1.0, 1.0), ratio=(20 / 12, 20 / 12))
    out = crop_pixels(whole, (12, 20), memoryview(buffer))
    assert torch.equal(out, view) and out.untyped_storage().data_ptr() != address + 128
    out.zero_()
    assert bytes(buffer) == encode_pixels(stored)  # the caller's tensor is its own
    readonly = pixel_tensor(bytes(buffer))  # bytes are copied once, without torch's warning
    assert torch.equal(readonly, view)


def test_decode_modes_give_the_stored_pixels(pixel_dataset: str) -> None:
    members = _members(pixel_dataset)
    options = StreamOptions(output="dict")
    for mode in ("rgb8", "pil", "raw"):
        dataset = StreamingDataset(pixel_dataset, batch_size=None, decode=mode, options=options)
        for sample in dataset:
            stored = _stored(members[sample["__key__"]])
            image = sample["image"]
            if mode == "rgb8":
                assert image.is_contiguous()
                assert torch.equal(image, torch.from_numpy(stored).permute(2, 0, 1))
            elif mode == "pil":
                assert isinstance(image, Image.Image) and np.array_equal(np.asarray(image), stored)
            else:
                assert bytes(image) == members[sample["__key__"]]
    center = v2.Compose([v2.CenterCrop(20), v2.ToDtype(torch.float32, scale=True)])
    dataset = StreamingDataset(pixel_dataset, batch_size=4, decode="rgb8", transform=center)
    images, labels = next(iter(dataset))
    assert images.shape == (4, 3, 20, 20) and labels.shape == (4,)


def test_a_broken_member_names_shard_and_key_or_is_skipped(
    pixel_dataset: str, tmp_path: pathlib.Path
) -> None:
    broken = tmp_path / "broken"
    build_shards(write_folder(tmp_path / "images", 6), broken, pixels="short=24")
    shard = broken / "shard-000000.tar"
    data = bytearray(shard.read_bytes())
    at = data.index(b"'descr': '|u1'")  # the first sample's pixel header: now 8-byte floats
    data[at : at + 14] = b"'descr': '<f8'"
    shard.write_bytes(bytes(data))
    with tarfile.open(shard) as archive:
        first = archive.getmembers()[0].name.partition(".")[0]
    dataset = StreamingDataset(
        str(broken), batch_size=None, decode="rgb8", shuffle=False, transform=train_transform()
    )
    with pytest.raises(DecodeError, match=rf"shard-000000\.tar: key '{first}'.*pixels\.npy"):
        list(dataset)
    skipping = StreamingDataset(
        str(broken),
        batch_size=None,
        decode="rgb8",
        shuffle=False,
        transform=train_transform(),
        on_error="skip",
    )
    assert len(list(skipping)) == 5


def test_workers_read_exact_epochs_and_resume_exactly(pixel_dataset: str) -> None:
    def make() -> StreamingDataLoader:
        dataset = StreamingDataset(
            pixel_dataset,
            batch_size=4,
            seed=3,
            decode="rgb8",
            transform=train_transform(),
            options=StreamOptions(output="dict"),
        )
        return StreamingDataLoader(dataset, num_workers=2)

    loader = make()
    keys = set(_members(pixel_dataset))
    for _ in range(2):
        batches = list(loader)
        assert all(batch["image"].shape == (4, 3, SIZE, SIZE) for batch in batches)
        seen = [key for batch in batches for key in batch["__key__"]]
        assert sorted(seen) == sorted(keys)  # every sample once per epoch
    assert_loader_resumes(make, key=lambda batch: tuple(batch["__key__"]), num_points=1)


def test_seeded_runs_draw_the_same_crops_in_workers(pixel_dataset: str) -> None:
    def images(workers: int) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)  # the DataLoader seeds its workers' RNGs from the default one
        dataset = StreamingDataset(
            pixel_dataset,
            batch_size=4,
            seed=5,
            decode="rgb8",
            transform=train_transform(),
            options=StreamOptions(output="dict"),
        )
        loader = StreamingDataLoader(dataset, num_workers=workers)
        return {k: img for b in loader for k, img in zip(b["__key__"], b["image"], strict=True)}

    first, again = images(2), images(2)
    assert first.keys() == again.keys()
    assert all(torch.equal(first[key], again[key]) for key in first)


def test_random_access_by_key_gives_the_stored_pixels(pixel_dataset: str) -> None:
    members = _members(pixel_dataset)
    plain = RandomAccessDataset(pixel_dataset, decode="rgb8", options=StreamOptions(output="dict"))
    cropped = RandomAccessDataset(pixel_dataset, decode="rgb8", transform=train_transform())
    assert len(plain) == len(members)
    for position, key in enumerate(sorted(members)):
        stored = torch.from_numpy(_stored(members[key])).permute(2, 0, 1)
        assert torch.equal(plain.by_key(key)["image"], stored)
        image, label = cropped[position]
        assert image.shape == (3, SIZE, SIZE) and label in (0, 1, 2)


def test_views_and_mixtures_with_jpeg_shards(pixel_dataset: str, tmp_path: pathlib.Path) -> None:
    keys = sorted(_members(pixel_dataset))[::3]
    make_view(pixel_dataset, tmp_path / "view", keys=keys)
    view = StreamingDataset(
        str(tmp_path / "view"),
        batch_size=None,
        decode="rgb8",
        transform=train_transform(),
        options=StreamOptions(output="dict"),
    )
    samples = list(view)
    assert sorted(sample["__key__"] for sample in samples) == keys
    assert {tuple(sample["image"].shape) for sample in samples} == {(3, SIZE, SIZE)}

    jpegs = tmp_path / "jpegs"
    build_shards(write_folder(tmp_path / "images", 12), jpegs, max_samples_per_shard=4)
    streams = [Stream(pixel_dataset, proportion=0.5), Stream(str(jpegs), proportion=0.5)]
    mixed = StreamingDataset(
        streams,
        epoch_size=20,
        batch_size=4,
        seed=2,
        decode="rgb8",
        transform=train_transform(),
        options=StreamOptions(output="dict"),
    )
    loader = StreamingDataLoader(mixed, num_workers=2)
    batches = list(loader)
    assert len(batches) == 5 and {b["image"].shape for b in batches} == {(4, 3, SIZE, SIZE)}
    counts = collections.Counter(url.rpartition("/")[0] for b in batches for url in b["__url__"])
    quotas = stream_quotas([24, 12], [0.5, 0.5], [None, None], 20)
    assert [counts[pixel_dataset], counts[str(jpegs)]] == quotas  # each stream's exact share


def _rank_epochs(rank: int, dataset: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        ds = StreamingDataset(
            dataset,
            batch_size=4,
            seed=2,
            decode="rgb8",
            transform=train_transform(),
            options=StreamOptions(output="dict"),
        )
        loader = StreamingDataLoader(ds, num_workers=2)
        epochs = []
        for epoch in range(2):
            ds.set_epoch(epoch)
            batches = list(loader)
            assert all(batch["image"].shape == (4, 3, SIZE, SIZE) for batch in batches)
            epochs.append([key for batch in batches for key in batch["__key__"]])
        pathlib.Path(out, f"{rank}.json").write_text(json.dumps(epochs))
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_rank_cleanly()


@pytest.mark.slow
def test_ranks_split_pixel_epochs_exactly(pixel_dataset: str, tmp_path: pathlib.Path) -> None:
    spawn_ranks(
        _rank_epochs,
        args=(pixel_dataset, str(tmp_path / "store"), str(tmp_path)),
        nprocs=2,
        join=True,
    )
    ranks = [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]
    keys = sorted(_members(pixel_dataset))
    for epoch in range(2):
        first, second = ranks[0][epoch], ranks[1][epoch]
        assert len(first) == len(second) == 12  # equal batches on every rank
        assert sorted(first + second) == keys  # together, every sample once
    assert ranks[0][0] != ranks[0][1]  # a new order each epoch


def _tails() -> dict[str, list[v2.Transform]]:
    """The steps after the crop that fuse: float normalised, uint8, and as tv_tensors images."""
    return {
        "normalised": train_transform().transforms[1:],
        "uint8": [v2.RandomHorizontalFlip(), v2.RandomVerticalFlip(), v2.PILToTensor()],
        "image": [v2.RandomHorizontalFlip(), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)],
    }


@pytest.mark.parametrize("tail", ["normalised", "uint8", "image"])
@pytest.mark.parametrize("kind", ["pixels.npy", "jpg"])
def test_batched_crops_are_finished_into_the_batch_as_one_by_one(tail: str, kind: str) -> None:
    transform = v2.Compose([v2.RandomResizedCrop(48, antialias=True), *_tails()[tail]])
    one_by_one = crop_decoder_for(transform, "rgb8")
    batched = crop_decoder_for(transform, "rgb8", batched=True)
    assert one_by_one is not None and batched is not None
    jpegs = [_photo(120, 90, seed) for seed in range(6)]
    decoded = [decode_image(jpeg, "jpg", "rgb8") for jpeg in jpegs]
    pixels = [encode_pixels(image.permute(1, 2, 0).numpy()) for image in decoded]
    members = pixels if kind == "pixels.npy" else jpegs
    torch.manual_seed(7)
    expected = [one_by_one(member, kind) for member in members]
    after_expected = torch.rand(1)
    torch.manual_seed(7)
    pending = [batched(member, kind) for member in members]
    after_pending = torch.rand(1)
    assert all(isinstance(value, PendingImage) for value in pending)
    assert after_pending == after_expected  # the flips drawn at decode time, in the same order
    batch = stack_or_list(pending, True)
    assert batch.dtype == expected[0].dtype and batch.is_contiguous()
    assert torch.equal(batch, torch.stack(expected))  # the same values, to the bit
    if kind == "pixels.npy":  # and torchvision's transform on the decoded image (same draws)
        torch.manual_seed(7)
        generic = [
            transform(tv_tensors.Image(image)).as_subclass(torch.Tensor) for image in decoded
        ]
        torch.testing.assert_close(batch, torch.stack(generic))


def test_pending_crops_mixed_with_other_images_are_finished_first() -> None:
    decoder = crop_decoder_for(train_transform(16), "rgb8", batched=True)
    assert decoder is not None
    member = encode_pixels(np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8))
    torch.manual_seed(0)
    pending = [decoder(member, "pixels.npy") for _ in range(3)]
    finished = [value.finish() for value in pending]
    plain = torch.rand(3, 16, 16)  # e.g. a PNG through the generic path
    mixed = stack_or_list([pending[0], plain, pending[1]], True)
    assert torch.equal(mixed, torch.stack([finished[0], plain, finished[1]]))
    other = torch.rand(3, 8, 8)  # shapes differ: a list of finished images
    listed = stack_or_list([pending[2], other], True)
    assert isinstance(listed, list) and torch.equal(listed[0], finished[2]) and listed[1] is other


def test_workers_write_normalised_crops_into_their_batches(tmp_path: pathlib.Path) -> None:
    # A fixed box and a crop of the whole image flipped every time: each batch row is known.
    build_shards(write_folder(tmp_path / "images", 12), tmp_path / "ds", pixels="32x24",
                 max_samples_per_shard=5)  # fmt: skip
    members = _members(str(tmp_path / "ds"))
    steps = train_transform().transforms
    whole = v2.RandomResizedCrop((24, 32), scale=(1.0, 1.0), ratio=(4 / 3, 4 / 3), antialias=True)
    transform = v2.Compose([whole, v2.RandomHorizontalFlip(p=1.0), *steps[2:]])
    options = StreamOptions(output="dict")
    dataset = StreamingDataset(
        str(tmp_path / "ds"), batch_size=4, decode="rgb8", transform=transform, options=options
    )
    seen = 0
    for batch in StreamingDataLoader(dataset, num_workers=2):
        images = batch["image"]
        assert images.shape == (4, 3, 24, 32) and images.dtype == torch.float32
        assert images.is_contiguous()
        for key, image in zip(batch["__key__"], images, strict=True):
            stored = tv_tensors.Image(torch.from_numpy(_stored(members[key])).permute(2, 0, 1))
            expected = transform(stored).as_subclass(torch.Tensor)
            torch.testing.assert_close(image, expected)
            seen += 1
    assert seen == len(members) == 12
