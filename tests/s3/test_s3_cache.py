"""The local shard cache: whole objects only, hits skip the network, LRU eviction within limit."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import threading
import time
from typing import Any

import pytest

from shardstream._storage import ReadOptions, Store
from shardstream.errors import StorageError
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET, payload

SIZE = 600_000


def url(name: str) -> str:
    return f"s3://{BUCKET}/cache/{name}.tar"


def put(moto_fs: Any, *names: str) -> dict[str, bytes]:
    blobs = {name: payload(SIZE, seed=index) for index, name in enumerate(names)}
    for name, blob in blobs.items():
        moto_fs.pipe(url(name), blob)
    return blobs


def cache_options(folder: pathlib.Path, max_bytes: int | None = None) -> ReadOptions:
    return ReadOptions(
        read_ahead_bytes=2**20, cache_dir=str(folder), cache_max_bytes=max_bytes, backoff_s=0.01
    )


def read(name: str, options: dict[str, Any], read_options: ReadOptions) -> bytes:
    with Store(url(name), options, read_options).open_read() as stream:
        return stream.read()


def cached_files(folder: pathlib.Path) -> list[str]:
    """Cache entries and temporary files (not the empty lock files)."""
    return sorted(p.name for p in folder.iterdir() if not p.name.endswith(".lock"))


def test_cache_hit_avoids_the_network(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy, tmp_path: pathlib.Path
) -> None:
    blobs = put(moto_fs, "a")
    options = cache_options(tmp_path / "cache")
    assert read("a", proxy_options, options) == blobs["a"]
    assert fault_proxy.count("GET", "/cache/a.tar") == 1
    assert len(cached_files(tmp_path / "cache")) == 1
    for _ in range(3):
        assert read("a", proxy_options, options) == blobs["a"]
    assert fault_proxy.count("GET", "/cache/a.tar") == 1, "later epochs read the local copy"


def test_pieces_of_a_shard_share_one_download(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy, tmp_path: pathlib.Path
) -> None:
    blobs = put(moto_fs, "a")
    options = cache_options(tmp_path / "cache")
    for start in (0, 200_000, 400_000):  # the reader opens a shard once per piece
        with Store(url("a"), proxy_options, options).open_read() as stream:
            stream.seek(start)
            assert stream.read(1000) == blobs["a"][start : start + 1000]
    assert fault_proxy.count("GET", "/cache/a.tar") == 1


@pytest.mark.usefixtures("store_latency")
def test_failed_downloads_leave_no_entry_and_faults_are_resumed(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy, tmp_path: pathlib.Path
) -> None:
    blobs = put(moto_fs, "a")
    folder = tmp_path / "cache"
    options = dataclasses.replace(cache_options(folder), max_attempts=2)
    fault_proxy.add(method="GET", path_contains="/cache/a.tar", action="503", times=2)
    with pytest.raises(StorageError):
        read("a", proxy_options, options)
    assert cached_files(folder) == [], "no entry and no temporary file is left"
    # A download that resumes after a fault caches exactly the object's bytes.
    fault_proxy.add(method="GET", path_contains="/cache/a.tar", action="cut", after_bytes=300_001)
    assert read("a", proxy_options, options) == blobs["a"]
    (entry,) = cached_files(folder)
    assert (folder / entry).read_bytes() == blobs["a"]


def test_lru_eviction_keeps_the_folder_within_its_limit(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy, tmp_path: pathlib.Path
) -> None:
    blobs = put(moto_fs, "a", "b", "c")
    folder = tmp_path / "cache"
    options = cache_options(folder, max_bytes=int(2.5 * SIZE))
    for name in ("a", "b", "a", "c"):  # "a" is used again, so "b" is the least recently used
        assert read(name, proxy_options, options) == blobs[name]
        time.sleep(0.02)  # distinct last-use times
    sizes = [(folder / name).stat().st_size for name in cached_files(folder)]
    assert sum(sizes) <= options.cache_max_bytes and len(sizes) == 2
    fault_proxy.clear()
    assert read("a", proxy_options, options) == blobs["a"]
    assert read("c", proxy_options, options) == blobs["c"]
    assert fault_proxy.count("GET") == 0, "a and c stayed cached"
    assert read("b", proxy_options, options) == blobs["b"]
    assert fault_proxy.count("GET", "/cache/b.tar") == 1, "b was evicted"


def test_object_larger_than_the_cache_is_streamed_not_cached(
    moto_fs: Any, proxy_options: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    blobs = put(moto_fs, "a")
    options = cache_options(tmp_path / "cache", max_bytes=SIZE // 2)
    assert read("a", proxy_options, options) == blobs["a"]
    assert cached_files(tmp_path / "cache") == []


def test_concurrent_readers_share_one_cache_folder(
    moto_fs: Any, proxy_options: dict[str, Any], tmp_path: pathlib.Path
) -> None:
    names = ["a", "b", "c", "d"]
    blobs = put(moto_fs, *names)
    folder = tmp_path / "cache"
    options = cache_options(folder, max_bytes=2 * SIZE)
    errors: list[BaseException] = []

    def worker(offset: int) -> None:
        try:
            for step in range(8):
                name = names[(offset + step) % len(names)]
                assert read(name, proxy_options, options) == blobs[name]
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert not errors
    entries = [p for p in folder.iterdir() if p.suffix == ".shard"]
    assert sum(p.stat().st_size for p in entries) <= 2 * SIZE
    assert all(".tmp-" not in name for name in os.listdir(folder))
