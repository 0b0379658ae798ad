"""Appending to a dataset on S3: conditional writes, kills at every phase, failed requests."""

from __future__ import annotations

import multiprocessing
import pathlib
import signal
import warnings
from collections.abc import Callable
from typing import Any

import fsspec
import pytest

from shardstream._catalog.versions import list_versions, publish_version, read_version
from shardstream._format.manifest import Manifest, read_manifest
from shardstream._format.shardtable import ShardInfo
from shardstream._format.verify import find_problems
from shardstream._storage import Store
from shardstream._storage.backends.s3 import S3Backend
from shardstream._storage.backends.s3client import S3Upload
from shardstream.errors import DatasetExistsError
from shardstream.shardwriter import _state as state
from shardstream.shardwriter import build_shards
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET
from tests.shardwriter.growth import write_day
from tests.shardwriter.helpers import kill_at

OPTIONS: dict[str, Any] = {"max_samples_per_shard": 2}


def _objects(moto_fs: Any, prefix: str) -> dict[str, bytes]:
    moto_fs.invalidate_cache()
    return {
        path.rsplit("/", 1)[-1]: moto_fs.cat_file(path)
        for path in moto_fs.find(f"{BUCKET}/{prefix}")
        if "/_shardstream_build/" not in path
    }


def test_exclusive_create_is_a_conditional_put(storage_options: dict[str, Any]) -> None:
    store = Store(f"s3://{BUCKET}/claims", storage_options)
    assert store.create_exclusive("claim.json", b"first")
    assert not store.create_exclusive("claim.json", b"second")  # If-None-Match: * refused it
    assert store.read_bytes("claim.json") == b"first"


def test_a_version_published_twice_with_other_contents_is_refused(
    storage_options: dict[str, Any],
) -> None:
    store = Store(f"s3://{BUCKET}/race", storage_options)
    shard = ShardInfo("shard-000000.tar", 1, 1024, "ab" * 32, "shard-000000.idx")
    publish_version(store, Manifest(shards=(shard,), version=2))
    publish_version(store, Manifest(shards=(shard,), version=2))  # a rerun: the same bytes
    other = Manifest(shards=(shard, ShardInfo("shard-000001.tar", 1, 1024, None)), version=2)
    with pytest.raises(DatasetExistsError, match=r"s3://.*/race: version 2 was published by"):
        publish_version(store, other)


@pytest.fixture
def days(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    return write_day(tmp_path / "day1", 1), write_day(tmp_path / "day2", 2, per_class=3)


def test_append_on_s3_publishes_a_new_version(days, storage_options, moto_fs) -> None:
    day1, day2 = days
    dest = f"s3://{BUCKET}/grow/train"
    build_shards(day1, dest, storage_options=storage_options, **OPTIONS)
    before = _objects(moto_fs, "grow/train")
    manifest = build_shards(day2, dest, storage_options=storage_options, append=True, **OPTIONS)
    after = _objects(moto_fs, "grow/train")
    assert manifest.version == 2 and manifest.num_samples == 14
    assert {n: after[n] for n in before if n not in ("manifest.json", "_info.json")} == {
        n: d for n, d in before.items() if n not in ("manifest.json", "_info.json")
    }
    store = Store(dest, storage_options)
    assert list_versions(store) == [1, 2]
    assert read_version(store, 1).num_samples == 8
    assert find_problems(store, read_manifest(store)) == []
    from shardstream.streaming import StreamingDataset

    options = _stream(storage_options)
    newest, old = (StreamingDataset(dest, version=v, options=options) for v in (None, 1))
    # the default order depends on the mean sample size: each version keeps its own
    assert newest.fingerprint(1) == old.fingerprint()
    assert newest.versions.get(1).settings.plan == old.settings.plan


def _stream(storage_options: dict[str, Any]) -> Any:
    from shardstream.streaming import StreamOptions

    return StreamOptions(storage_options=storage_options)


def _upload_of(suffix: str) -> Callable[[tuple], bool]:
    return lambda args: isinstance(args[0], S3Upload) and args[0].key.endswith(suffix)


def _named(fragment: str) -> Callable[[tuple], bool]:
    return lambda args: fragment in str(args[2])  # (backend, fs, path, ...)


KILL_POINTS: dict[str, tuple[Any, str, Callable[[tuple], bool]]] = {
    "plan-claim": (S3Backend, "create_exclusive", _named("plan.json")),
    "mid-rename": (S3Backend, "move", lambda args: "shard-" in str(args[3])),
    "keep-version-1": (S3Backend, "create_exclusive", _named("manifest.v000001.json")),
    "versioned-manifest": (S3Backend, "create_exclusive", _named("manifest.v000002.json")),
    "manifest-put": (S3Upload, "close", _upload_of("/manifest.json")),
    "before-state-removal": (state, "remove_state", lambda args: True),
}


def _append_and_kill_at(point: str, nth: int, source: Any, dest: str, options: Any) -> None:
    fsspec.AbstractFileSystem.clear_instance_cache()  # no event loop of the parent's
    kill_at(*KILL_POINTS[point], nth)
    build_shards(source, dest, storage_options=options, append=True, **OPTIONS)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("point", "nth"),
    [
        ("plan-claim", 1),
        ("mid-rename", 3),
        ("keep-version-1", 1),
        ("versioned-manifest", 1),
        ("manifest-put", 1),
        ("before-state-removal", 1),
    ],
)
def test_append_killed_on_s3_then_rerun(days, proxy_options, moto_fs, point, nth) -> None:
    day1, day2 = days
    clean, dest = f"s3://{BUCKET}/clean", f"s3://{BUCKET}/killed"
    for where in (clean, dest):
        build_shards(day1, where, storage_options=proxy_options, **OPTIONS)
    base = _objects(moto_fs, "clean")
    build_shards(day2, clean, storage_options=proxy_options, append=True, **OPTIONS)
    appended = _objects(moto_fs, "clean")
    child = multiprocessing.get_context("fork").Process(
        target=_append_and_kill_at, args=(point, nth, day2, dest, proxy_options)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # forking a threaded process
        child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL, f"the append never reached {point} #{nth}"
    published = _objects(moto_fs, "killed")["manifest.json"]
    assert published in (base["manifest.json"], appended["manifest.json"])
    store = Store(dest, proxy_options)
    assert find_problems(store, read_manifest(store)) == []
    build_shards(day2, dest, storage_options=proxy_options, append=True, **OPTIONS)
    assert _objects(moto_fs, "killed") == appended
    moto_fs.invalidate_cache()
    assert not moto_fs.find(f"{BUCKET}/killed/_shardstream_build")


def test_failed_manifest_put_leaves_the_old_version(
    days, proxy_options, fault_proxy: FaultProxy, moto_fs
) -> None:
    day1, day2 = days
    dest = f"s3://{BUCKET}/faulty"
    build_shards(day1, dest, storage_options=proxy_options, **OPTIONS)
    before = _objects(moto_fs, "faulty")["manifest.json"]
    fault_proxy.add(action="403", method="PUT", path_contains="/manifest.json", times=0)
    with pytest.raises(PermissionError, match=r"faulty/manifest\.json: uploading"):
        build_shards(day2, dest, storage_options=proxy_options, append=True, **OPTIONS)
    assert _objects(moto_fs, "faulty")["manifest.json"] == before
    fault_proxy.clear()
    manifest = build_shards(day2, dest, storage_options=proxy_options, append=True, **OPTIONS)
    assert manifest.version == 2 and read_manifest(Store(dest, proxy_options)).version == 2


def test_second_append_on_s3_is_refused_while_the_first_is_unfinished(
    days, proxy_options, tmp_path
) -> None:
    day1, day2 = days
    dest = f"s3://{BUCKET}/two"
    build_shards(day1, dest, storage_options=proxy_options, **OPTIONS)
    child = multiprocessing.get_context("fork").Process(
        target=_append_and_kill_at, args=("mid-rename", 2, day2, dest, proxy_options)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL  # the first append holds its claim (plan file)
    day3 = write_day(tmp_path / "day3", 3)
    with pytest.raises(DatasetExistsError, match=r"s3://.*/two: another build or append"):
        build_shards(day3, dest, storage_options=proxy_options, append=True, **OPTIONS)
    assert read_manifest(Store(dest, proxy_options)).version == 1
    build_shards(day2, dest, storage_options=proxy_options, append=True, **OPTIONS)  # finishes
    manifest = build_shards(day3, dest, storage_options=proxy_options, append=True, **OPTIONS)
    assert manifest.version == 3 and manifest.num_samples == 8 + 6 + 8


def test_index_on_a_prefix_that_gained_shards_reads_only_the_new_ones(
    proxy_options, fault_proxy: FaultProxy, moto_fs, tmp_path
) -> None:
    from shardstream import index_shards
    from tests.catalog.test_index_growth import _write_shards

    local = tmp_path / "shards"
    _write_shards(local, 0, 2)
    for path in sorted(local.iterdir()):
        moto_fs.pipe_file(f"{BUCKET}/other/{path.name}", path.read_bytes())
    dest = f"s3://{BUCKET}/other"
    first = index_shards(dest, storage_options=proxy_options)
    _write_shards(local, 2, 1)
    moto_fs.pipe_file(f"{BUCKET}/other/part-00002.tar", (local / "part-00002.tar").read_bytes())
    fault_proxy.clear()
    manifest = index_shards(dest, storage_options=proxy_options)
    assert fault_proxy.count("GET", "part-00000.tar") == 0  # the indexed shards are not read
    assert fault_proxy.count("GET", "part-00002.tar") >= 1
    assert manifest.version == 2 and list(manifest.shards)[:2] == list(first.shards)
    assert manifest.num_samples == 12
    assert list_versions(Store(dest, proxy_options)) == [1, 2]
