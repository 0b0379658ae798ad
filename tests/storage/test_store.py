"""The Store: atomic writes, listings, ranged reads and moves on local disk and ``memory://``."""

from __future__ import annotations

import pathlib
import pickle

import pytest

from shardstream._storage import ReadOptions, Store
from shardstream.errors import ConfigError


def test_local_atomic_write_publishes_only_on_success(tmp_path: pathlib.Path) -> None:
    store = Store(tmp_path / "out")
    with store.open_atomic_write("shard-000000.tar") as stream:
        stream.write(b"x" * 1000)
        assert not store.exists("shard-000000.tar"), "the final name must not exist yet"
    assert (tmp_path / "out" / "shard-000000.tar").read_bytes() == b"x" * 1000
    assert store.list_names() == ["shard-000000.tar"]


def test_local_atomic_write_cleans_up_on_error(tmp_path: pathlib.Path) -> None:
    with pytest.raises(RuntimeError), Store(tmp_path).open_atomic_write("s.tar") as stream:
        stream.write(b"partial")
        raise RuntimeError("killed mid-write")
    assert list(tmp_path.iterdir()) == []


def test_memory_filesystem_atomic_write_listing_and_reads() -> None:
    store = Store("memory://fs-test/a")
    with store.open_atomic_write("one.bin") as stream:
        stream.write(b"1")
    with pytest.raises(ValueError), store.open_atomic_write("two.bin") as stream:
        stream.write(b"2")
        raise ValueError("boom")
    assert store.list_names() == ["one.bin"]
    assert store.read_bytes("one.bin") == b"1" and store.size("one.bin") == 1
    assert store.exists("one.bin") and not store.exists("two.bin")
    store.move("one.bin", "moved/one.bin")
    assert store.child("moved").list_names() == ["one.bin"] and not store.exists("one.bin")
    store.remove_folder("moved")
    assert store.list_names("moved") == []


def test_urls_children_and_locality(tmp_path: pathlib.Path) -> None:
    remote = Store("s3://bucket/prefix/")
    assert remote.url("manifest.json") == "s3://bucket/prefix/manifest.json"
    assert remote.child("sub").url("x") == "s3://bucket/prefix/sub/x"
    assert Store(tmp_path).url("x") == str(tmp_path / "x")
    assert Store(tmp_path).is_local and Store(f"file://{tmp_path}").is_local
    assert not remote.is_local


def test_credentials_never_show_and_stores_pickle_without_their_filesystem() -> None:
    url = "https://reader:SECRET-pw@host/p"  # an HTTP(S) URL's user info is its credentials
    store = Store(url, {"secret": "hunter22"}, ReadOptions(max_attempts=2))
    assert "SECRET" not in repr(store) and "SECRET" not in store.shown("x")
    assert store.secrets == ["hunter22", "reader:SECRET-pw", "SECRET-pw"]
    memory = Store("memory://pickle-test")
    memory.exists("x")  # resolves the filesystem
    assert memory._resolved.peek() is not None
    copy = pickle.loads(pickle.dumps(memory))
    assert copy == memory and copy._resolved.peek() is None


def test_for_urls_finds_the_common_folder() -> None:
    store, names = Store.for_urls(["s3://b/x/train-0.tar", "s3://b/x/train-1.tar"])
    assert store.root == "s3://b/x" and names == ["train-0.tar", "train-1.tar"]
    store, names = Store.for_urls(["s3://b1/a.tar", "s3://b2/b.tar"])
    assert store.root == "" and names == ["s3://b1/a.tar", "s3://b2/b.tar"]
    store, names = Store.for_urls(["d/a/x.tar", "d/b/y.tar"])
    assert store.root == "d" and names == ["a/x.tar", "b/y.tar"]
    with pytest.raises(ConfigError, match="different storage"):
        Store.for_urls(["s3://b/a.tar", "/local/b.tar"])


def test_local_ranged_read_starts_at_start_and_stops_at_end(tmp_path: pathlib.Path) -> None:
    (tmp_path / "data.bin").write_bytes(bytes(range(256)) * 4)
    store = Store(tmp_path)
    with store.open_read("data.bin", start=10, end=20) as stream:
        assert stream.read(4) == bytes(range(10, 14))
        assert stream.read() == bytes(range(14, 20))
        assert stream.read(5) == b""
    with store.open_read("data.bin", start=1000) as stream:
        assert stream.read() == bytes(range(232, 256))


def test_memory_ranged_read(tmp_path: pathlib.Path) -> None:
    store = Store("memory://ranged-test")
    with store.open_atomic_write("blob") as stream:
        stream.write(bytes(range(200)))
    with store.open_read("blob", start=50, end=60) as stream:
        assert stream.read() == bytes(range(50, 60))
