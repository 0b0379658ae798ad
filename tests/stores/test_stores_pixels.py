"""Pixel shards (``build --pixels``) read from every store as from a folder: the same pixels,
cropped by the transform, through the fault proxy's resets and 503s."""

from __future__ import annotations

import pathlib
from typing import Any

import torch

from shardstream import RandomAccessDataset, build_shards
from shardstream._storage import ReadOptions
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from tests.stores.conftest import StoreUnderTest
from tests.streaming.test_pixels import SIZE, train_transform, write_folder

FAST = ReadOptions(max_attempts=5, backoff_s=0.01, max_backoff_s=0.05, timeout_s=2.0)


def _images(url: str, storage_options: dict[str, Any], crop: bool) -> dict[str, torch.Tensor]:
    """Every sample's image by key: stored pixels (``crop=False``), or cropped in batches."""
    options = StreamOptions(
        output="dict", storage_options=storage_options, read_options=FAST, piece_size=4
    )
    dataset = StreamingDataset(
        url,
        batch_size=4 if crop else None,
        seed=1,
        decode="rgb8",
        options=options,
        transform=train_transform() if crop else None,
    )
    loader = StreamingDataLoader(dataset, num_workers=2)
    if not crop:
        return {sample["__key__"]: sample["image"] for sample in loader}
    return {
        key: image
        for batch in loader
        for key, image in zip(batch["__key__"], batch["image"], strict=True)
    }


def test_pixel_shards_stream_from_a_store_as_from_a_folder(
    any_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    folder = tmp_path / "ds"
    build_shards(
        write_folder(tmp_path / "images", 30), folder, pixels="short=24", max_samples_per_shard=7
    )
    url = any_store.put(folder, f"pixels-{tmp_path.name}")
    local = _images(str(folder), {}, crop=False)
    assert len(local) == 30
    proxy = any_store.proxy
    rules = [
        proxy.add(method="GET", path_contains=".tar", nth=2, action="reset", after_bytes=3000),
        proxy.add(method="GET", path_contains=".tar", nth=4, action="503"),
    ]
    remote = _images(url, any_store.options, crop=False)
    assert remote.keys() == local.keys()
    assert all(torch.equal(remote[key], local[key]) for key in local)  # the same pixels
    assert all(rule.hits == 1 for rule in rules), [rule.hits for rule in rules]
    cropped = _images(url, any_store.options, crop=True)
    assert cropped.keys() == local.keys()
    assert {image.shape for image in cropped.values()} == {(3, SIZE, SIZE)}
    by_key = RandomAccessDataset(
        url,
        decode="rgb8",
        options=StreamOptions(output="dict", storage_options=any_store.options, read_options=FAST),
    )
    here = RandomAccessDataset(str(folder), decode="rgb8", options=StreamOptions(output="dict"))
    for key in sorted(local)[::7]:
        assert torch.equal(by_key.by_key(key)["image"], here.by_key(key)["image"])
