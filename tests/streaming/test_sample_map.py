"""Memory-mapped reads of indexed local shards: same samples, no copies, bounded and safe."""

from __future__ import annotations

import gc
import itertools
import mmap
import pathlib
import warnings
import weakref

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from shardstream._format.tarreader import parse_plain_sample
from shardstream._storage import Store
from shardstream._storage.backends import localmaps
from shardstream._storage.backends.localmaps import LocalRanges, WindowMaps
from shardstream.streaming import StreamingDataset, StreamOptions
from shardstream.streaming._worker import pieces
from shardstream.streaming._worker.pieces import open_piece
from tests.streaming.shards import make_dataset, sample_offsets, tiny_jpeg


def _shard(tmp_path: pathlib.Path, count: int = 9) -> tuple[pathlib.Path, list[int]]:
    """A webdataset-written shard and its index (sample starts, then the end of the last)."""
    import webdataset as wds

    path = tmp_path / "shard.tar"
    with wds.TarWriter(str(path)) as sink:
        for index in range(count):
            sink.write({"__key__": f"k{index}", "jpg": tiny_jpeg(index), "cls": index})
    return path, sample_offsets(path)


def _read(
    path: pathlib.Path, offsets: list[int], memory_map: bool, max_map_bytes: int = 1 << 30
) -> list[dict]:
    pool = LocalRanges(Store(path.parent), max_idle=0, max_map_bytes=max_map_bytes)
    return list(open_piece(pool, path.name, 0, None, None, offsets, memory_map=memory_map))


@pytest.fixture(autouse=True)
def _map_small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """These shards are tiny: map their pieces too (a piece under 64 KiB is copied)."""
    monkeypatch.setattr(pieces, "COPY_MAX_BYTES", 0)


def test_short_pieces_are_slices_of_the_shard_map_or_else_copied(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under the copy size a piece is a slice of its shard's map; of a shard that cannot be
    mapped whole (here: over the map budget) it is copied, not mapped alone."""
    monkeypatch.setattr(pieces, "COPY_MAX_BYTES", 64 << 10)
    path, offsets = _shard(tmp_path)
    sliced = _read(path, offsets, True)
    assert [s["jpg"] for s in sliced] == [tiny_jpeg(i) for i in range(9)]
    assert all(isinstance(s["jpg"].obj, mmap.mmap) for s in sliced)
    copied = _read(path, offsets, True, max_map_bytes=0)
    assert [s["jpg"] for s in copied] == [tiny_jpeg(i) for i in range(9)]
    assert all(isinstance(s["jpg"].obj, np.ndarray) for s in copied)
    assert len({id(s["jpg"].obj) for s in copied}) == 1  # one read for the whole piece


def test_mapped_samples_equal_read_samples_and_share_the_page_cache(
    tmp_path: pathlib.Path,
) -> None:
    path, offsets = _shard(tmp_path)
    mapped, read = _read(path, offsets, True), _read(path, offsets, False)
    assert mapped == read and [s["jpg"] for s in mapped] == [tiny_jpeg(i) for i in range(9)]
    assert all(isinstance(s["jpg"].obj, mmap.mmap) for s in mapped)  # views of the mapping
    assert all(isinstance(s["jpg"].obj, np.ndarray) for s in read)  # a short piece: one read
    assert len({id(s["jpg"].obj) for s in mapped}) == 1  # one window for this small piece


def test_mapped_views_are_copy_on_write(tmp_path: pathlib.Path) -> None:
    path, offsets = _shard(tmp_path)
    before = path.read_bytes()
    sample = _read(path, offsets, True)[3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a read-only buffer would warn here
        image = torch.frombuffer(sample["jpg"], dtype=torch.uint8)
    image.zero_()  # changes this process's copy of the page only
    assert bytes(sample["jpg"]) == bytes(len(tiny_jpeg(3)))
    assert path.read_bytes() == before
    assert _read(path, offsets, True)[3]["jpg"] == tiny_jpeg(3)


def test_windows_are_bounded_and_unmapped_when_released(tmp_path: pathlib.Path) -> None:
    path, offsets = _shard(tmp_path, 12)
    window = offsets[4] - offsets[0]  # about four samples a window
    with open(path, "rb") as stream:
        samples = WindowMaps(stream, offsets, 12, window=window)
        views = [samples.view(ordinal) for ordinal in range(12)]
    assert all(view is not None for view in views)
    mappings = {id(view.obj): view.obj for view in views if view is not None}
    assert len(mappings) >= 3
    assert all(len(m) <= window + mmap.ALLOCATIONGRANULARITY for m in mappings.values())
    parsed = [parse_plain_sample(v, "shard.tar", 0) for v in views if v is not None]
    assert [s["jpg"] for s in parsed if s is not None] == [tiny_jpeg(i) for i in range(12)]
    del parsed
    first = weakref.ref(next(iter(mappings.values())))
    del views, mappings, samples
    gc.collect()
    assert first() is None  # unmapped once no view is left


def test_a_shard_shorter_than_its_index_is_read_not_mapped(tmp_path: pathlib.Path) -> None:
    """Mapping bytes past the end of a file would kill the process with SIGBUS; the reader
    reports the truncation instead."""
    path, offsets = _shard(tmp_path)
    path.write_bytes(path.read_bytes()[: offsets[6] + 700])
    with open(path, "rb") as stream:
        assert not WindowMaps(stream, offsets, 9).usable
        assert WindowMaps(stream, offsets, 5).usable  # samples before the cut can be mapped
    with pytest.raises(Exception, match=r"shard\.tar: truncated at byte offset \d+.*key 'k5'"):
        _read(path, offsets, True)


def test_a_failed_mapping_falls_back_to_reading(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path, offsets = _shard(tmp_path)

    def refuse(*args: object, **kwargs: object) -> mmap.mmap:
        raise OSError(12, "Cannot allocate memory")  # e.g. vm.max_map_count reached

    monkeypatch.setattr(mmap, "mmap", refuse)
    samples = _read(path, offsets, True)
    assert [s["jpg"] for s in samples] == [tiny_jpeg(i) for i in range(9)]
    assert all(isinstance(s["jpg"].obj, np.ndarray) for s in samples)


@pytest.mark.parametrize("workers", [0, 2])
def test_epochs_are_the_same_with_and_without_memory_maps(
    tmp_path: pathlib.Path, workers: int
) -> None:
    root, _ = make_dataset(tmp_path, 40, 7)

    def epoch(memory_map: bool) -> list[tuple[list[bytes], list[int]]]:
        options = StreamOptions(memory_map=memory_map, num_open=3, piece_size=4)
        ds = StreamingDataset(root, decode="raw", batch_size=8, seed=3, options=options)
        loader = DataLoader(ds, batch_size=None, num_workers=workers)
        return [([bytes(t.numpy()) for t in images], labels.tolist()) for images, labels in loader]

    mapped = epoch(True)
    assert mapped == epoch(False)
    assert sum(len(labels) for _, labels in mapped) == 40


def test_a_pooled_handle_maps_without_seeking_and_asks_the_length_once(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardstream._storage.backends import local

    path, offsets = _shard(tmp_path)
    pool = LocalRanges(Store(path.parent), max_idle=4)
    asked = []
    real_fstat = local.os.fstat
    monkeypatch.setattr(local.os, "fstat", lambda fd: asked.append(fd) or real_fstat(fd))
    views = [pool.view(path.name, offsets[i], offsets[i + 1]) for i in range(len(offsets) - 1)]
    data = path.read_bytes()
    assert [bytes(v) for v in views] == [data[a:b] for a, b in itertools.pairwise(offsets)]
    assert len(asked) == 1 and pool.num_idle == 1  # one handle, its length asked once
    with pool.lend(path.name, offsets[2]) as stream:  # a reused handle is still positioned
        assert stream.read(10) == data[offsets[2] : offsets[2] + 10]
    assert pool.view(path.name, 0, len(data) + 1) is None  # past the end: read, never mapped
    pool.close()
    assert pool.num_idle == 0 and pool.view(path.name, 0, 512) is not None  # after close too


def test_cached_ranges_skip_the_read_ahead_advice(tmp_path: pathlib.Path) -> None:
    import os

    path = tmp_path / "blob"
    path.write_bytes(os.urandom(1 << 20))
    path.read_bytes()  # now in the page cache
    descriptor = os.open(path, os.O_RDONLY)
    read_end, write_end = os.pipe()
    try:
        if hasattr(os, "RWF_NOWAIT"):  # Linux
            assert localmaps._cached(descriptor, 4096, 1 << 19)
        assert not localmaps._cached(read_end, 0, 100)  # cannot tell (a pipe): advise anyway
    finally:
        for fd in (descriptor, read_end, write_end):
            os.close(fd)


def test_a_pool_maps_each_shard_once_and_bounds_what_stays_mapped(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pieces of a shard are slices of one map (no map per piece); past the byte budget the
    least recently used shard is dropped, a shard over the budget is mapped piece by piece,
    and closing the pool unmaps everything once no sample views it."""
    shards = []
    for name in ("a", "b", "c"):
        folder = tmp_path / name
        folder.mkdir()
        shards.append(_shard(folder, 30 if name == "c" else 9))
    for (path, _), target in zip(shards, ("a.tar", "b.tar", "c.tar"), strict=True):
        path.rename(tmp_path / target)
    sizes = {n: (tmp_path / n).stat().st_size for n in ("a.tar", "b.tar", "c.tar")}
    offsets = {n: sample_offsets(tmp_path / n) for n in sizes}
    assert sizes["c.tar"] > sizes["a.tar"] + sizes["b.tar"] and sizes["a.tar"] == sizes["b.tar"]
    maps_made = []
    real_mmap = mmap.mmap
    monkeypatch.setattr(mmap, "mmap", lambda *a, **k: maps_made.append(a[1:]) or real_mmap(*a, **k))
    live_before = localmaps._MAPS.live
    pool = LocalRanges(Store(tmp_path), max_idle=4, max_map_bytes=sizes["a.tar"] + sizes["b.tar"])

    def read_all(name: str) -> list[memoryview]:
        found = offsets[name]
        views = [pool.view(name, found[i], found[i + 1]) for i in range(len(found) - 1)]
        data = (tmp_path / name).read_bytes()
        assert [bytes(v) for v in views] == [data[a:b] for a, b in itertools.pairwise(found)]
        return views

    held = read_all("a.tar")
    assert maps_made == [(sizes["a.tar"],)]  # the whole file, once for all nine pieces
    read_all("b.tar")
    assert pool._maps.mapped_bytes == sizes["a.tar"] + sizes["b.tar"]
    read_all("a.tar")
    assert len(maps_made) == 2  # both kept
    maps_made.clear()
    read_all("c.tar")  # larger than the budget: each piece mapped alone, nothing dropped
    assert len(maps_made) == len(offsets["c.tar"]) - 1
    assert all(size < sizes["c.tar"] for (size, *_) in maps_made)
    pool._maps.max_bytes = sizes["c.tar"]
    maps_made.clear()
    read_all("c.tar")  # now it fits: a and b are dropped, least recently used first
    assert maps_made == [(sizes["c.tar"],)] and pool._maps.mapped_bytes == sizes["c.tar"]
    pool.close()
    gc.collect()
    assert [bytes(v) for v in held] == [bytes(v) for v in read_all("a.tar")]  # still valid
    del held
    gc.collect()
    assert localmaps._MAPS.live == live_before  # every map and descriptor given back


def test_persistent_workers_read_the_same_epochs_mapped_and_unmapped(
    tmp_path: pathlib.Path,
) -> None:
    """Shard maps are kept for a pass and made afresh by the next (same workers)."""
    root, _ = make_dataset(tmp_path, 40, 7)

    def epochs(memory_map: bool) -> list[list[bytes]]:
        options = StreamOptions(memory_map=memory_map, num_open=3, piece_size=4)
        ds = StreamingDataset(root, decode="raw", batch_size=8, seed=5, options=options)
        loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
        found = []
        for epoch in range(3):
            ds.set_epoch(epoch)
            found.append([bytes(t.numpy()) for images, _ in loader for t in images])
        return found

    mapped = epochs(True)
    assert mapped == epochs(False)
    assert len(mapped[0]) == 40 and mapped[0] != mapped[1]
