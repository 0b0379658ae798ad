"""The storage boundary: atomic writes never leave a half-written file under the final name."""

from __future__ import annotations

import pathlib

import pytest

from shardstream import _fs


def test_local_atomic_write_publishes_only_on_success(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "out" / "shard-000000.tar"
    with _fs.open_atomic_write(str(target)) as stream:
        stream.write(b"x" * 1000)
        assert not target.exists(), "the final name must not exist before the write completes"
    assert target.read_bytes() == b"x" * 1000
    assert sorted(p.name for p in target.parent.iterdir()) == ["shard-000000.tar"]


def test_local_atomic_write_cleans_up_on_error(tmp_path: pathlib.Path) -> None:
    target = tmp_path / "shard-000001.tar"
    with pytest.raises(RuntimeError), _fs.open_atomic_write(str(target)) as stream:
        stream.write(b"partial")
        raise RuntimeError("killed mid-write")
    assert list(tmp_path.iterdir()) == []


def test_memory_filesystem_atomic_write_and_listing() -> None:
    with _fs.open_atomic_write("memory://fs-test/a/one.bin") as stream:
        stream.write(b"1")
    with pytest.raises(ValueError), _fs.open_atomic_write("memory://fs-test/a/two.bin") as stream:
        stream.write(b"2")
        raise ValueError("boom")
    assert _fs.list_names("memory://fs-test/a") == ["one.bin"]
    assert _fs.read_bytes("memory://fs-test/a/one.bin") == b"1"
    assert _fs.exists("memory://fs-test/a/one.bin")
    assert not _fs.exists("memory://fs-test/a/two.bin")


def test_join_and_is_local(tmp_path: pathlib.Path) -> None:
    assert _fs.join("s3://bucket/prefix/", "manifest.json") == "s3://bucket/prefix/manifest.json"
    assert _fs.join(str(tmp_path), "x") == str(tmp_path / "x")
    assert _fs.is_local(str(tmp_path)) and not _fs.is_local("s3://b/k")


def test_local_ranged_read_starts_at_start_and_stops_at_end(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 4)
    with _fs.open_read(str(path), start=10, end=20) as stream:
        assert stream.read(4) == bytes(range(10, 14))
        assert stream.read() == bytes(range(14, 20))
        assert stream.read(5) == b""
    with _fs.open_read(str(path), start=1000) as stream:
        assert stream.read() == bytes(range(232, 256))
