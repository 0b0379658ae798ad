"""ShardCache on local disk: keys, publish-when-complete, LRU eviction, killed and racing writers.

The multi-process tests fork real processes that share one cache folder, as DataLoader workers do.
"""

from __future__ import annotations

import multiprocessing
import os
import pathlib
import shutil
import signal
import time
import warnings
from collections.abc import Callable

import pytest

from shardstream._storage.remote.cache import ShardCache
from tests.storage.fakes import random_bytes

URL = "s3://bucket/train/shard-000003.tar"
SIZE = 4_000
ETAG = '"0123456789abcdef"'


def download(cache: ShardCache, path: str, data: bytes, pause_s: float = 0.0) -> None:
    writer = cache.start(path, len(data))
    assert writer is not None
    for offset in range(0, len(data), 1_000):
        writer.write(data[offset : offset + 1_000])
        if pause_s:
            time.sleep(pause_s)  # lets a concurrent writer interleave
    writer.commit()


def read_entry(cache: ShardCache, path: str, size: int) -> bytes | None:
    stream = cache.open_cached(path, size)
    if stream is None:
        return None
    with stream:
        return stream.read()


def entries(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".shard"))


def temporaries(folder: pathlib.Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if ".tmp-" in p.name)


def set_last_use(path: str, seconds_ago: float) -> None:
    when = time.time() - seconds_ago
    os.utime(path, (when, when))


def test_entries_are_keyed_by_url_size_and_etag(tmp_path: pathlib.Path) -> None:
    cache = ShardCache(str(tmp_path / "cache"), None)
    path = cache.path_for(URL, SIZE, ETAG)
    assert cache.path_for(URL, SIZE, ETAG) == path, "the same object finds the same entry"
    others = {
        cache.path_for(URL.replace("000003", "000004"), SIZE, ETAG),
        cache.path_for(URL, SIZE + 1, ETAG),
        cache.path_for(URL, SIZE, '"rewritten"'),
    }
    assert path not in others and len(others) == 3
    for candidate in {path, *others}:
        assert os.path.dirname(candidate) == cache.folder and candidate.endswith(".shard")
    data = random_bytes(SIZE)
    download(cache, path, data)
    assert read_entry(cache, path, SIZE) == data
    rewritten = cache.path_for(URL, SIZE, '"rewritten"')
    assert read_entry(cache, rewritten, SIZE) is None, "a new version never hits the old entry"


def test_only_complete_downloads_are_published(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "cache"
    cache = ShardCache(str(folder), None)
    data = random_bytes(SIZE)
    path = cache.path_for(URL, SIZE, ETAG)
    writer = cache.start(path, SIZE)
    assert writer is not None
    writer.write(data[:1_000])
    assert read_entry(cache, path, SIZE) is None and len(temporaries(folder)) == 1
    writer.write(data[1_000:])
    assert read_entry(cache, path, SIZE) is None, "nothing is served before commit"
    writer.commit()
    assert read_entry(cache, path, SIZE) == data and temporaries(folder) == []

    short = cache.path_for(URL, SIZE, '"short"')
    writer = cache.start(short, SIZE)
    assert writer is not None
    writer.write(data[:2_000])
    writer.commit()  # the stream was closed early
    assert not os.path.exists(short) and temporaries(folder) == []

    aborted = cache.path_for(URL, SIZE, '"aborted"')
    writer = cache.start(aborted, SIZE)
    assert writer is not None
    writer.write(data[:2_000])
    writer.abort()
    writer.write(data[2_000:])  # ignored once aborted
    writer.commit()
    assert writer.written == 2_000 and not os.path.exists(aborted) and temporaries(folder) == []
    assert entries(folder) == [os.path.basename(path)]


def test_an_entry_of_the_wrong_size_is_dropped(tmp_path: pathlib.Path) -> None:
    cache = ShardCache(str(tmp_path), None)
    path = cache.path_for(URL, SIZE, ETAG)
    pathlib.Path(path).write_bytes(b"truncated")
    assert cache.open_cached(path, SIZE) is None and not os.path.exists(path)


def _download_and_die(folder: str, path: str, data: bytes) -> None:
    writer = ShardCache(folder, None).start(path, len(data))
    assert writer is not None
    writer.write(data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)


def run_children(target: Callable[..., None], *args_per_child: tuple[object, ...]) -> list[int]:
    """Run ``target`` in forked processes, one per argument tuple; their exit codes."""
    context = multiprocessing.get_context("fork")
    children = [context.Process(target=target, args=args) for args in args_per_child]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: forking with threads
        for child in children:
            child.start()
    for child in children:
        child.join(timeout=60)
    codes = [child.exitcode for child in children]
    for child in children:
        if child.exitcode is None:
            child.kill()
            child.join()
        child.close()
    assert None not in codes, "a child hung"
    return codes  # type: ignore[return-value]


def test_a_killed_download_is_never_served_and_its_leftover_is_removed_later(
    tmp_path: pathlib.Path,
) -> None:
    folder = tmp_path / "cache"
    cache = ShardCache(str(folder), None)
    data = random_bytes(SIZE)
    path = cache.path_for(URL, SIZE, ETAG)
    assert run_children(_download_and_die, (str(folder), path, data)) == [-signal.SIGKILL]
    leftover = temporaries(folder)
    assert len(leftover) == 1, "the killed child left its temporary file behind"
    assert cache.open_cached(path, SIZE) is None and entries(folder) == []
    download(cache, path, data)
    assert read_entry(cache, path, SIZE) == data
    cache.evict()
    assert temporaries(folder) == leftover, "a recent temporary may still be being written"
    set_last_use(str(folder / leftover[0]), seconds_ago=2 * 3600)
    cache.evict()
    assert temporaries(folder) == [] and read_entry(cache, path, SIZE) == data


def test_least_recently_used_entries_are_evicted_beyond_max_bytes(tmp_path: pathlib.Path) -> None:
    folder = tmp_path / "cache"
    cache = ShardCache(str(folder), max_bytes=3 * SIZE)
    blobs = {name: random_bytes(SIZE, seed=index) for index, name in enumerate("abcd")}
    paths = {name: cache.path_for(f"s3://bucket/{name}.tar", SIZE, ETAG) for name in blobs}
    for age_s, name in zip((300, 200, 100), "abc", strict=True):
        download(cache, paths[name], blobs[name])
        set_last_use(paths[name], seconds_ago=age_s)
    assert read_entry(cache, paths["a"], SIZE) == blobs["a"], "a hit marks 'a' as just used"
    still_open = open(paths["b"], "rb")  # noqa: SIM115 - held across the eviction below
    download(cache, paths["d"], blobs["d"])  # over the limit: the least recently used goes
    assert [os.path.exists(paths[name]) for name in "abcd"] == [True, False, True, True]
    with still_open:
        assert still_open.read() == blobs["b"], "an evicted entry stays readable while open"

    smaller = ShardCache(str(folder), max_bytes=2 * SIZE)
    for age_s, name in zip((500, 400, 300), "cad", strict=True):
        set_last_use(paths[name], seconds_ago=age_s)
    smaller.evict(keep=paths["c"])  # the oldest, but just downloaded by this process
    assert [os.path.exists(paths[name]) for name in "acd"] == [False, True, True]


def test_objects_over_the_limit_are_not_cached(tmp_path: pathlib.Path) -> None:
    cache = ShardCache(str(tmp_path), max_bytes=SIZE - 1)
    assert not cache.fits(SIZE) and cache.fits(SIZE - 1)
    assert cache.start(cache.path_for(URL, SIZE, ETAG), SIZE) is None
    assert ShardCache(str(tmp_path), None).fits(10**15)


def test_an_unwritable_folder_turns_caching_off(
    tmp_path: pathlib.Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = ShardCache(str(tmp_path / "cache"), None)
    shutil.rmtree(tmp_path / "cache")  # works as root too, unlike a read-only mode
    assert cache.start(cache.path_for(URL, SIZE, ETAG), SIZE) is None
    assert "not caching" in caplog.text


def _fetch_through_cache(
    folder: str, path: str, data: bytes, marks: str, barrier: object, use_lock: bool
) -> None:
    """One worker: on a miss, download (marking it), then read the entry and check it."""
    cache = ShardCache(folder, None)
    barrier.wait(timeout=30)  # type: ignore[attr-defined]
    if use_lock:
        with cache.lock(path):
            if cache.open_cached(path, len(data)) is None:
                pathlib.Path(marks, str(os.getpid())).touch()
                download(cache, path, data, pause_s=0.002)
    else:
        pathlib.Path(marks, str(os.getpid())).touch()
        download(cache, path, data, pause_s=0.002)
    assert read_entry(cache, path, len(data)) == data


@pytest.mark.parametrize("use_lock", [True, False], ids=["locked", "racing"])
def test_two_processes_fetching_one_entry_end_with_one_complete_file(
    tmp_path: pathlib.Path, use_lock: bool
) -> None:
    folder, marks = tmp_path / "cache", tmp_path / "marks"
    marks.mkdir()
    cache = ShardCache(str(folder), None)
    data = random_bytes(40_000)
    path = cache.path_for(URL, len(data), ETAG)
    barrier = multiprocessing.get_context("fork").Barrier(2)
    args = (str(folder), path, data, str(marks), barrier, use_lock)
    assert run_children(_fetch_through_cache, args, args) == [0, 0]
    downloads = len(list(marks.iterdir()))
    assert downloads == (1 if use_lock else 2), "the lock makes the second worker wait and hit"
    assert entries(folder) == [os.path.basename(path)] and temporaries(folder) == []
    assert pathlib.Path(path).read_bytes() == data
