"""Batches in shared memory: raw bytes as views into one buffer, stacked tensors, open handles."""

from __future__ import annotations

import copy
import os
import pathlib
import pickle

import torch
from torch.utils.data import DataLoader

from shardstream._storage import Store
from shardstream.streaming import StreamingDataset, StreamOptions
from shardstream.streaming._worker.batch import ByteViews, pack_bytes, stack_or_list
from shardstream.streaming._worker.pieces import open_piece
from tests.streaming.shards import make_dataset, make_samples


def test_pack_bytes_views_share_one_buffer_and_round_trip() -> None:
    blobs = [b"abc", b"", b"\x00\xff" * 1000, b"z"]
    views = pack_bytes(blobs, shared=True)
    assert [bytes(view.numpy()) for view in views] == blobs
    assert all(view.dtype == torch.uint8 and view.dim() == 1 for view in views)
    pointers = {view.untyped_storage().data_ptr() for view in views}
    assert len(pointers) == 1
    restored = pickle.loads(pickle.dumps(views))
    assert type(restored) is list and [bytes(v.numpy()) for v in restored] == blobs
    assert [bytes(v.numpy()) for v in copy.copy(views)] == blobs
    assert isinstance(stack_or_list(blobs, pack=True), ByteViews)
    assert stack_or_list(blobs) == blobs


def _raw_items(root: pathlib.Path, workers: int, output: str) -> dict[str, bytes]:
    options = StreamOptions(output=output)
    ds = StreamingDataset(root, decode="raw", batch_size=4, options=options, seed=3)
    found: dict[str, bytes] = {}
    for batch in DataLoader(ds, batch_size=None, num_workers=workers):
        if output == "dict":
            images, keys = batch["image"], batch["__key__"]
        else:
            images, keys = batch[0], [str(int(label)) for label in batch[1]]
        assert isinstance(images, list) and all(isinstance(v, torch.Tensor) for v in images)
        storages = {view.untyped_storage().data_ptr() for view in images}
        # Across processes: one buffer per batch, views into it. In-process: the reader's own
        # buffers, wrapped without a copy.
        assert len(storages) == (1 if workers else len(images))
        for key, view in zip(keys, images, strict=True):
            found.setdefault(key, bytes(view.numpy()))
    return found


def test_raw_batches_round_trip_exact_bytes_through_workers(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 30, 7)
    expected = {sample["__key__"]: sample["jpg"] for sample in make_samples(30)}
    assert _raw_items(root, 2, "dict") == expected
    assert _raw_items(root, 0, "dict") == expected


def test_stacked_batches_come_from_shared_memory_in_workers(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 16, 7)
    ds = StreamingDataset(root, batch_size=4, seed=0)
    images, labels = next(iter(DataLoader(ds, batch_size=None, num_workers=1)))
    assert images.shape == (4, 3, 12, 16) and images.dtype == torch.uint8
    assert labels.dtype == torch.int64
    direct = [batch[0] for batch in StreamingDataset(root, batch_size=4, seed=0)]
    assert any(torch.equal(images, other) for other in direct)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class _CountingStore(Store):
    """A store that records every file it opens."""

    def __init__(self, root: pathlib.Path) -> None:
        super().__init__(root)
        self.opened: list[str] = []

    def open_read(self, name: str = "", start: int = 0, end: int | None = None):  # type: ignore[no-untyped-def, override]
        self.opened.append(name)
        return super().open_read(name, start, end)


def test_handle_pool_reuses_and_closes(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 40, 7)
    store = _CountingStore(root)
    before = _open_fds()
    pool = store.ranges(max_idle=2)
    for start in range(0, 7, 2):
        piece = open_piece(pool, "shard-000000.tar", start, min(start + 2, 7))
        assert [s["__key__"] for s in piece] == [
            f"s{i:06d}" for i in range(start, min(start + 2, 7))
        ]
    assert store.opened == ["shard-000000.tar"] and pool.num_idle == 1
    pool.close()
    assert pool.num_idle == 0 and _open_fds() == before


def test_epochs_do_not_leak_file_descriptors(tmp_path: pathlib.Path) -> None:
    root, _ = make_dataset(tmp_path, 40, 7)
    ds = StreamingDataset(root, decode="raw", batch_size=4)
    list(ds)
    before = _open_fds()
    for epoch in range(3):
        ds.set_epoch(epoch)
        list(ds)
        iterator = iter(ds)
        next(iterator)
        del iterator  # an epoch abandoned half way
    assert _open_fds() == before
