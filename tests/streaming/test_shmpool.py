"""Reused shared-memory batch buffers: real DataLoader workers, batches kept, sliced, resent."""

from __future__ import annotations

import gc
import pathlib
import pickle
import zlib
from multiprocessing.reduction import ForkingPickler
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader

from shardstream._storage.background import ProcessLocal
from shardstream.errors import ConfigError
from shardstream.shardwriter import build_shards
from shardstream.streaming import StreamingDataset, StreamOptions
from shardstream.streaming._worker import shmpool
from shardstream.streaming._worker import shmpool as inline
from tests.conftest import encode_image

BATCH = 4


def crc_image(data: bytes, extension: str) -> torch.Tensor:
    """A 27 KB float 'image' whose every value is fixed by the sample's bytes."""
    return torch.full((3, 48, 48), float(zlib.crc32(data) % 65521))


def _build(root: pathlib.Path, count: int, size: int) -> tuple[pathlib.Path, dict[str, bytes]]:
    samples = [
        {"__key__": f"s{i:05d}", "jpg": encode_image(size, size, seed=i), "cls": i % 4}
        for i in range(count)
    ]
    build_shards(samples, root, max_samples_per_shard=9)
    return root, {s["__key__"]: s["jpg"] for s in samples}


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> tuple[pathlib.Path, dict[str, bytes]]:
    return _build(tmp_path_factory.mktemp("pool") / "small", 48, 16)


def _check(batch: dict[str, Any], jpegs: dict[str, bytes]) -> None:
    for key, image in zip(batch["__key__"], batch["image"], strict=True):
        assert torch.equal(image, crc_image(jpegs[key], "jpg")), key


def _dataset(root: pathlib.Path, **options: Any) -> StreamingDataset:
    return StreamingDataset(
        root,
        decode=crc_image,
        batch_size=BATCH,
        seed=5,
        options=StreamOptions(output="dict", **options),
    )


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_reuse_buffers_and_every_batch_stays_exact(
    small: tuple[pathlib.Path, dict[str, bytes]], persistent: bool
) -> None:
    root, jpegs = small
    loader = DataLoader(
        _dataset(root), batch_size=None, num_workers=2, persistent_workers=persistent
    )
    for _ in range(8):
        keys = []
        for batch in loader:
            _check(batch, jpegs)
            keys += batch["__key__"]
        assert sorted(keys) == sorted(jpegs)
    # Buffers were mapped here once per worker and reused; buffers of workers that exited
    # (8 epochs of fresh workers) were let go rather than piling up.
    assert 0 < shmpool.buffer_stats()["attached"] <= 2 * 6


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_and_views_kept_by_the_consumer_are_never_overwritten(
    small: tuple[pathlib.Path, dict[str, bytes]], workers: int
) -> None:
    root, jpegs = small
    loader = DataLoader(_dataset(root, batch_buffers=2), batch_size=None, num_workers=workers)
    kept = list(loader)  # 12 batches held at once: more than the buffers, so some are fresh
    views = [(batch["__key__"][1:], batch["image"][1:]) for batch in loader]  # batch freed
    gc.collect()
    for batch in kept:
        _check(batch, jpegs)
    for keys, images in views:
        _check({"__key__": keys, "image": images}, jpegs)


def test_raw_byte_views_outlive_their_batch(tmp_path: pathlib.Path) -> None:
    root, jpegs = _build(tmp_path / "raw", 24, 320)
    ds = StreamingDataset(
        root, decode="raw", batch_size=BATCH, options=StreamOptions(output="dict")
    )
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    for _ in range(2):
        last = []
        for batch in loader:
            assert sum(len(v) for v in batch["image"]) >= inline.MIN_BYTES  # really pooled
            assert not batch["image"][0].is_shared()  # a worker buffer, not a torch segment
            last.append((batch["__key__"][-1], batch["image"][-1]))
            del batch
        for key, view in last:
            assert bytes(view.numpy()) == jpegs[key]


def test_spawned_workers_use_the_buffers_too(small: tuple[pathlib.Path, dict[str, bytes]]) -> None:
    root, jpegs = small
    before = shmpool.buffer_stats()["mapped"]
    loader = DataLoader(
        _dataset(root), batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    assert sum(len(b["__key__"]) for b in loader if _check(b, jpegs) is None) == len(jpegs)
    assert shmpool.buffer_stats()["mapped"] > before


def test_zero_buffers_means_a_fresh_segment_per_batch(
    small: tuple[pathlib.Path, dict[str, bytes]],
) -> None:
    root, jpegs = small
    loader = DataLoader(_dataset(root, batch_buffers=0), batch_size=None, num_workers=2)
    before = shmpool.buffer_stats()["mapped"]
    for batch in loader:
        _check(batch, jpegs)
        assert batch["image"].is_shared()
    assert shmpool.buffer_stats()["mapped"] == before
    with pytest.raises(ConfigError, match="batch_buffers"):
        _dataset(root, batch_buffers=-1)


@pytest.fixture
def fresh_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shmpool, "_pools", ProcessLocal(dict))


def _round_trip(tensor: torch.Tensor) -> torch.Tensor:
    return pickle.loads(bytes(ForkingPickler.dumps(tensor)))


def test_a_buffer_is_busy_until_the_last_view_on_the_receiving_side_is_freed(
    fresh_pool: None,
) -> None:
    sent = shmpool.empty((4, 3, 64, 64), torch.float32, 2)
    assert isinstance(sent, shmpool.PooledTensor)
    lease = sent._lease
    assert lease is not None
    buffer = lease.buffer
    sent.copy_(torch.arange(sent.numel(), dtype=torch.float32).view(sent.shape))
    received = _round_trip(sent)
    assert type(received) is torch.Tensor and torch.equal(received, sent)
    again = _round_trip(sent)  # sent twice: the second is a copy, not the buffer
    assert torch.equal(again, sent) and again.data_ptr() != received.data_ptr()
    del sent, again
    gc.collect()
    view = received[2:]
    del received
    gc.collect()
    assert int(buffer.words[shmpool.BUSY]) == 1  # a view is still alive
    fresh = shmpool.empty((4, 3, 64, 64), torch.float32, 1)  # none free: a fresh segment
    assert not isinstance(fresh, shmpool.PooledTensor) and fresh.is_shared()
    del view
    gc.collect()
    assert int(buffer.words[shmpool.BUSY]) == 0
    reused = shmpool.empty((4, 3, 64, 64), torch.float32, 1)
    assert isinstance(reused, shmpool.PooledTensor) and reused._lease is not None
    assert reused._lease.buffer is buffer


def test_an_unsent_batch_frees_its_buffer_and_plain_pickles_copy(fresh_pool: None) -> None:
    tensor = shmpool.empty((2, 3, 100, 100), torch.float32, 1)
    lease = tensor._lease
    assert lease is not None
    tensor.fill_(7.0)
    copy = pickle.loads(pickle.dumps(tensor))  # torch.save / plain pickle: an ordinary tensor
    assert type(copy) is torch.Tensor and torch.equal(copy, tensor)
    assert type(tensor[0]) is torch.Tensor and type(tensor + 1) is torch.Tensor
    kept = tensor[1]  # a worker-side view keeps the buffer busy
    del tensor
    gc.collect()
    assert int(lease.buffer.words[shmpool.BUSY]) == 1
    del kept
    gc.collect()
    assert int(lease.buffer.words[shmpool.BUSY]) == 0


def test_a_batch_larger_than_the_free_buffer_gets_a_new_generation(fresh_pool: None) -> None:
    small = shmpool.empty((inline.MIN_BYTES,), torch.uint8, 1)
    assert small._lease is not None
    small.fill_(1)
    received = _round_trip(small)
    del small
    gc.collect()
    big_bytes = 4 * max(received.untyped_storage().nbytes(), 1 << 20) + 1
    blocked = shmpool.empty((big_bytes,), torch.uint8, 1)
    assert not isinstance(blocked, shmpool.PooledTensor)  # the only buffer is still held
    del blocked, received
    gc.collect()
    big = shmpool.empty((big_bytes,), torch.uint8, 1)
    assert big._lease is not None and big._lease.buffer.capacity >= big_bytes
    big.fill_(9)
    assert int(_round_trip(big)[-1]) == 9
    tiny = shmpool.empty((100,), torch.uint8, 1)
    assert not isinstance(tiny, shmpool.PooledTensor)  # too small to be worth a buffer


def test_without_workers_batches_are_plain_tensors_on_reused_memory(fresh_pool: None) -> None:
    first = shmpool.empty((8, 3, 64, 64), torch.float32, 2, shared=False)
    assert type(first) is torch.Tensor and not first.is_shared()
    address = first.data_ptr()
    second = shmpool.empty((8, 3, 64, 64), torch.float32, 2, shared=False)
    assert second.data_ptr() != address  # the first is still alive
    third = shmpool.empty((8, 3, 64, 64), torch.float32, 2, shared=False)
    assert third.data_ptr() not in (address, second.data_ptr())  # both busy: fresh memory
    del first
    gc.collect()
    assert shmpool.empty((8, 3, 64, 64), torch.float32, 2, shared=False).data_ptr() == address


def test_without_workers_a_larger_batch_replaces_a_free_buffer(fresh_pool: None) -> None:
    kept = shmpool.empty((8, 3, 64, 64), torch.float32, 2, shared=False)  # the first buffer
    freed = shmpool.empty((8, 3, 64, 64), torch.float32, 2, shared=False)  # the second
    del freed
    gc.collect()
    # The second buffer is free but too small: replaced (this compared the buffers' arrays and
    # raised "truth value of an array is ambiguous" before, whenever it was not the first).
    bigger = shmpool.empty((8, 3, 128, 128), torch.float32, 2, shared=False)
    kept.fill_(1.0)
    bigger.fill_(2.0)
    assert bool((kept == 1.0).all()) and bool((bigger == 2.0).all())  # two distinct buffers


@pytest.mark.parametrize(
    "tensor",
    [
        torch.arange(64, dtype=torch.int64),
        torch.tensor(3.5),
        torch.empty(0, 3),
        torch.rand(5, 7).to(torch.bfloat16),
        torch.arange(24, dtype=torch.int16).view(2, 3, 4)[:, 1],  # not contiguous
    ],
)
def test_small_tensors_cross_inside_the_pickle(tensor: torch.Tensor) -> None:
    small = inline.inline(tensor)
    assert isinstance(small, inline.InlineTensor)
    received = _round_trip(small)
    assert type(received) is torch.Tensor and not received.is_shared()
    assert received.dtype == tensor.dtype and torch.equal(received, tensor)
    assert type(pickle.loads(pickle.dumps(small))) is torch.Tensor
    big = torch.zeros(inline.MIN_BYTES)
    assert inline.inline(big) is big


def test_worker_labels_arrive_as_plain_unshared_tensors(
    small: tuple[pathlib.Path, dict[str, bytes]],
) -> None:
    root, _ = small
    ds = StreamingDataset(root, decode=crc_image, batch_size=BATCH, seed=5)
    for images, labels in DataLoader(ds, batch_size=None, num_workers=2):
        assert type(labels) is torch.Tensor and not labels.is_shared()
        assert labels.dtype == torch.int64 and all(0 <= int(v) < 4 for v in labels)
        assert len(labels) == len(images)
