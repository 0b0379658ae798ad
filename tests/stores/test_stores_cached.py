"""Remote datasets that fit a local shard cache: whole shards downloaded once (in the
background, as announced), then read in the local order with no request per piece."""

from __future__ import annotations

import dataclasses
import pathlib
import time
from typing import Any

import pytest

from shardstream._storage import ReadOptions, Store
from shardstream.errors import ShardNotFoundError
from shardstream.streaming import StreamingDataLoader, StreamingDataset, StreamOptions
from shardstream.streaming._planning.order import LOCAL_ORDER
from tests.stores.conftest import StoreUnderTest
from tests.streaming.conformance import assert_loader_resumes
from tests.streaming.shards import make_dataset

NUM_SAMPLES, PER_SHARD = 120, 15  # 8 shards
#: What a shard's download (not a stat) has in its request target: GCS stats are GETs too.
DOWNLOAD = {"gcs": ".tar?alt=media"}
FAST = ReadOptions(max_attempts=5, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5.0)
LIMIT = 1 << 30  # holds every test dataset


def _published(store: StoreUnderTest, tmp_path: pathlib.Path) -> tuple[str, pathlib.Path]:
    folder, _ = make_dataset(tmp_path, NUM_SAMPLES, PER_SHARD, num_classes=6)
    return store.put(folder, f"cached-{tmp_path.name}"), folder


def _dataset(store: StoreUnderTest, url: str, read: ReadOptions, **stream: Any) -> Any:
    options = StreamOptions(output="dict", storage_options=store.options, read_options=read,
                            **stream)  # fmt: skip
    return StreamingDataset(url, decode="raw", batch_size=8, seed=3, options=options)


def _epoch(dataset: Any, workers: int = 2) -> list[tuple[str, bytes]]:
    return [(key, bytes(image)) for batch in StreamingDataLoader(dataset, num_workers=workers)
            for key, image in zip(batch["__key__"], batch["image"], strict=True)]  # fmt: skip


def test_a_dataset_that_fits_is_downloaded_once_and_read_in_the_local_order(
    any_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    url, folder = _published(any_store, tmp_path)
    local = _dataset(any_store, str(folder), FAST)
    read = dataclasses.replace(FAST, cache_dir=str(tmp_path / "c"), cache_max_bytes=LIMIT)
    cached = _dataset(any_store, url, read)
    assert cached.settings.order == local.settings.order == LOCAL_ORDER
    proxy, download = any_store.proxy, DOWNLOAD.get(any_store.name, ".tar")
    reset = proxy.add(method="GET", path_contains=download, nth=3, action="reset", after_bytes=2000)
    first = _epoch(cached)
    assert first == _epoch(local), "the local order, exact, under a reset mid-download"
    assert reset.hits == 1
    shards = sorted(path.name for path in folder.glob("*.tar"))
    # each shard once, whole (one resumed after the reset): no request per piece
    assert proxy.count("GET", download) == len(shards) + 1, proxy.requests
    proxy.clear()
    cached.set_epoch(1)
    second = _epoch(cached)
    assert sorted(second) == sorted(first) and second != first
    assert proxy.count("GET", download) == 0, "later epochs read the cache"


def test_a_dataset_larger_than_the_cache_or_a_cache_without_limit_keeps_the_remote_order(
    any_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    url, folder = _published(any_store, tmp_path)
    size = sum(path.stat().st_size for path in folder.glob("*.tar"))
    read = dataclasses.replace(FAST, cache_dir=str(tmp_path / "c"))
    fits = _dataset(any_store, url, dataclasses.replace(read, cache_max_bytes=size))
    larger = _dataset(any_store, url, dataclasses.replace(read, cache_max_bytes=size - 1))
    unlimited = _dataset(any_store, url, read)  # no cache_max_bytes: the disk may not hold it
    plain = _dataset(any_store, url, FAST)
    assert fits.settings.order == LOCAL_ORDER
    assert larger.settings.order == unlimited.settings.order == plain.settings.order
    assert plain.settings.order != LOCAL_ORDER
    assert sorted(_epoch(larger)) == sorted(_epoch(plain))


def test_announced_shards_download_in_the_background(
    http_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    url, folder = _published(http_store, tmp_path)
    store = Store(url, http_store.options, dataclasses.replace(FAST, cache_dir=str(tmp_path / "c")))
    names = sorted(path.name for path in folder.glob("*.tar"))
    ranges = store.ranges()
    proxy = http_store.proxy
    ranges.announce([(name, 0, 512) for name in names[:3]], "group")
    deadline = time.monotonic() + 10
    while proxy.count("GET", ".tar") < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert proxy.count("GET", ".tar") == 3, "announced shards are fetched before any open"
    for name in names[:4]:  # three downloaded already, the fourth now
        view = ranges.view(name, 0, 512)
        assert view is not None and bytes(view) == (folder / name).read_bytes()[:512]
    assert proxy.count("GET", ".tar") == 4
    ranges.close()


def test_a_missing_shard_is_named(http_store: StoreUnderTest, tmp_path: pathlib.Path) -> None:
    url, _ = _published(http_store, tmp_path)
    store = Store(url, http_store.options, dataclasses.replace(FAST, cache_dir=str(tmp_path / "c")))
    ranges = store.ranges()
    ranges.announce([("missing.tar", 0, 10)], "group")
    with pytest.raises(ShardNotFoundError, match=r"missing\.tar: shard not found"):
        ranges.view("missing.tar", 0, 10)
    ranges.close()


def test_resume_mid_epoch_from_the_cache(
    http_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    url, _ = _published(http_store, tmp_path)
    read = dataclasses.replace(FAST, cache_dir=str(tmp_path / "c"), cache_max_bytes=LIMIT)

    def make() -> StreamingDataLoader:
        return StreamingDataLoader(_dataset(http_store, url, read), num_workers=2)

    assert_loader_resumes(make, key=lambda batch: tuple(batch["__key__"]))
