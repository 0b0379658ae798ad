"""Writing on every writable store as on S3: builds, appends and versions publish atomically,
an exclusive create has one winner, and a second append waits for the first to finish."""

from __future__ import annotations

import multiprocessing
import pathlib
import signal
import warnings
from typing import Any

import fsspec
import pytest

from shardstream import build_shards
from shardstream._catalog.versions import list_versions, read_version
from shardstream._format.manifest import read_manifest
from shardstream._format.verify import find_problems
from shardstream._storage import Store
from shardstream.errors import DatasetExistsError
from shardstream.streaming import StreamingDataset, StreamOptions
from tests.shardwriter.growth import write_day
from tests.shardwriter.helpers import kill_at
from tests.stores.conftest import StoreUnderTest

OPTIONS: dict[str, Any] = {"max_samples_per_shard": 2}


@pytest.fixture(params=["gcs", "azure"])
def writable_store(request: pytest.FixtureRequest) -> StoreUnderTest:
    """Each store shardstream writes to (S3 has tests of its own, in tests/s3)."""
    return request.getfixturevalue(f"{request.param}_store")  # type: ignore[no-any-return]


def test_exclusive_create_has_one_winner(writable_store: StoreUnderTest) -> None:
    assert writable_store.write_url is not None
    store = Store(writable_store.write_url("claims"), writable_store.write_options)
    assert store.create_exclusive("claim.json", b"first")
    assert not store.create_exclusive("claim.json", b"second")  # the conditional create refused
    assert store.read_bytes("claim.json") == b"first"


def test_build_then_append_publishes_versions(
    writable_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    assert writable_store.write_url is not None
    day1, day2 = write_day(tmp_path / "day1", 1), write_day(tmp_path / "day2", 2, per_class=3)
    dest, options = writable_store.write_url("grow"), writable_store.write_options
    build_shards(day1, dest, storage_options=options, **OPTIONS)
    manifest = build_shards(day2, dest, storage_options=options, append=True, **OPTIONS)
    store = Store(dest, options)
    assert manifest.version == 2 and manifest.num_samples == 14
    assert list_versions(store) == [1, 2] and read_version(store, 1).num_samples == 8
    assert find_problems(store, read_manifest(store)) == []
    stream = StreamOptions(output="dict", storage_options=options)
    keys = [s["__key__"] for s in StreamingDataset(dest, decode="raw", options=stream)]
    old = [s["__key__"] for s in StreamingDataset(dest, decode="raw", version=1, options=stream)]
    assert len(keys) == len(set(keys)) == 14 and set(old) < set(keys) and len(old) == 8


def _append_and_kill(point: str, source: Any, dest: str, options: Any) -> None:
    from shardstream._storage.backends.generic import Backend

    fsspec.AbstractFileSystem.clear_instance_cache()  # no event loop of the parent's
    kill_at(Backend, point, lambda args: "shard-" in str(args[3]), 2)
    build_shards(source, dest, storage_options=options, append=True, **OPTIONS)


def test_a_second_append_is_refused_while_the_first_is_unfinished(
    writable_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    assert writable_store.write_url is not None
    day1, day2 = write_day(tmp_path / "day1", 1), write_day(tmp_path / "day2", 2, per_class=3)
    dest, options = writable_store.write_url("two"), writable_store.write_options
    build_shards(day1, dest, storage_options=options, **OPTIONS)
    child = multiprocessing.get_context("fork").Process(
        target=_append_and_kill, args=("move", day2, dest, options)
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        child.start()
    child.join(timeout=120)
    assert child.exitcode == -signal.SIGKILL  # the first append holds its claim (plan file)
    day3 = write_day(tmp_path / "day3", 3)
    with pytest.raises(DatasetExistsError, match=r"another build or append"):
        build_shards(day3, dest, storage_options=options, append=True, **OPTIONS)
    assert read_manifest(Store(dest, options)).version == 1
    build_shards(day2, dest, storage_options=options, append=True, **OPTIONS)  # finishes it
    manifest = build_shards(day3, dest, storage_options=options, append=True, **OPTIONS)
    assert manifest.version == 3 and manifest.num_samples == 8 + 6 + 8
