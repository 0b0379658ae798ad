"""HTTP(S) specifics: read-only (writing is a clear error), versions checked, requests in flight."""

from __future__ import annotations

import os
import pathlib

import pytest

from shardstream import build_shards
from shardstream._storage import ReadOptions, Store
from shardstream.errors import ConfigError, StorageError
from tests.stores.conftest import StoreUnderTest
from tests.stores.httpserver import RangeServer
from tests.streaming.shards import make_samples

FAST = ReadOptions(max_attempts=3, backoff_s=0.01, max_backoff_s=0.05, timeout_s=2.0)


def test_writing_to_an_http_url_is_a_clear_error(http_store: StoreUnderTest) -> None:
    url = f"{http_store.proxy.endpoint_url}/new"
    with pytest.raises(ConfigError, match=r"http stores are read-only.*write the dataset to"):
        build_shards(make_samples(4), url, max_samples_per_shard=2)
    with pytest.raises(ConfigError, match="read-only"):
        Store(url).create_exclusive("claim.json", b"{}")


def test_a_rewritten_object_is_never_mixed_with_the_old_one(
    http_store: StoreUnderTest, http_server: RangeServer, tmp_path: pathlib.Path
) -> None:
    folder = tmp_path / "blob"
    folder.mkdir()
    (folder / "data.bin").write_bytes(b"a" * 3_000_000)
    url = http_store.put(folder, "rewritten")
    options = ReadOptions(**{**vars(FAST), "read_ahead_bytes": 0})  # one GET at a time
    with Store(url, {}, options).open_read("data.bin") as stream:
        assert stream.read(100) == b"a" * 100
        target = pathlib.Path(http_server.root) / "rewritten" / "data.bin"
        target.write_bytes(b"b" * 3_000_000)
        os.utime(target, ns=(1, 1))  # another modification time: another ETag
        with pytest.raises(StorageError, match=r"data\.bin.*changed while it was being read"):
            stream.read()


def test_a_missing_object_is_not_retried(http_store: StoreUnderTest) -> None:
    url = f"{http_store.proxy.endpoint_url}/nothing-here"
    with pytest.raises(FileNotFoundError, match=r"nothing-here.*does not exist"):
        Store(url, {}, FAST).read_bytes("shard.tar")
    assert http_store.proxy.count("GET") == 1
