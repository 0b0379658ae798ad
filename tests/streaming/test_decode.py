"""Decode modes, labels, JSON, pickle refusal, and the reduced-size JPEG path."""

from __future__ import annotations

import pickle

import pytest
import torch
from PIL import Image
from torchvision.transforms import v2

from shardstream.errors import DecodeError
from shardstream.streaming._decoding.decode import split_sample
from shardstream.streaming._decoding.fastcrop import decode_image, min_side_of
from tests.conftest import encode_image

SAMPLE = {
    "__key__": "k",
    "__url__": "u.tar",
    "jpg": encode_image(32, 24, 1),
    "cls": b"3",
    "json": b'{"a": 1}',
    "txt": b"hi",
    "bin": b"\x00",
}


def test_modes() -> None:
    image, label, fields = split_sample(SAMPLE, "rgb8")
    assert image.shape == (3, 24, 32) and image.dtype == torch.uint8 and label == 3
    assert fields["json"] == {"a": 1} and fields["txt"] == "hi" and fields["bin"] == b"\x00"
    assert split_sample(SAMPLE, "raw")[0] == SAMPLE["jpg"]
    pil = split_sample(SAMPLE, "pil")[0]
    assert isinstance(pil, Image.Image) and pil.size == (32, 24)
    assert split_sample(SAMPLE, lambda data, ext: (len(data), ext))[0] == (
        len(SAMPLE["jpg"]),
        "jpg",
    )
    png = {"__key__": "p", "png": encode_image(8, 6, 2, fmt="PNG")}
    image, label, _ = split_sample(png, "rgb8")
    assert image.shape == (3, 6, 8) and label == -1


def test_rgb8_paths_agree() -> None:
    full = decode_image(SAMPLE["jpg"], "jpg", "rgb8")
    same = decode_image(SAMPLE["jpg"], "jpg", "rgb8", min_side=24)  # too small to reduce
    assert torch.equal(full, same)


def test_pickle_only_when_allowed() -> None:
    sample = {"__key__": "k", "pyd": pickle.dumps({"x": 1})}
    assert isinstance(split_sample(sample, "raw")[2]["pyd"], bytes)
    assert split_sample(sample, "raw", allow_pickle=True)[2]["pyd"] == {"x": 1}


def test_corrupt_image_names_shard_and_key() -> None:
    with pytest.raises(DecodeError, match=r"u.tar: key 'k'"):
        split_sample({**SAMPLE, "jpg": b"\xff\xd8broken"}, "rgb8")


def test_min_side_from_transforms() -> None:
    assert min_side_of(v2.Compose([v2.Resize(256), v2.CenterCrop(224)])) == 256
    assert min_side_of(v2.Compose([v2.RandomResizedCrop(224, scale=(0.25, 1))])) == 448
    assert min_side_of(v2.Compose([v2.RandomHorizontalFlip(), v2.Resize(64)])) == 64
    assert min_side_of(v2.Compose([v2.CenterCrop(224)])) is None
    assert min_side_of(v2.ToDtype(torch.float32)) is None


def test_draft_decodes_large_jpegs_smaller_but_big_enough() -> None:
    big = encode_image(640, 480, 5)
    image = decode_image(big, "jpg", "rgb8", min_side=100)
    assert min(image.shape[1:]) >= 100 and image.shape[1] < 480
