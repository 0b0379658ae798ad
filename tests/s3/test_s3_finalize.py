"""Finishing a build on object stores: parts are moved server-side, the state prefix goes away."""

from __future__ import annotations

import pathlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

import fsspec
import pytest

from shardstream import build_shards
from shardstream._format.verify import verify_dataset
from shardstream._storage import Store
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET, payload


def test_finalize_copies_on_the_server_and_removes_the_state_prefix(
    make_image_folder: Callable[..., pathlib.Path],
    proxy_options: dict[str, Any],
    fault_proxy: FaultProxy,
    moto_fs: Any,
) -> None:
    images = make_image_folder(num_classes=2, per_class=10)
    dest = f"s3://{BUCKET}/finalize/train"
    manifest = build_shards(images, dest, storage_options=proxy_options, max_samples_per_shard=4)
    assert len(manifest.shards) == 5
    assert fault_proxy.count("GET", ".tar") == 0  # no part was downloaded to be re-uploaded
    # one CopyObject per shard and one per shard's byte-offset index
    assert fault_proxy.count("PUT", "/shard-") == 10
    moto_fs.invalidate_cache()
    names = sorted(p.rsplit("/", 1)[-1] for p in moto_fs.find(f"{BUCKET}/finalize/train"))
    assert names == sorted(
        ["_info.json", "manifest.json", *(n for s in manifest.shards for n in (s.name, s.index))]
    )
    assert verify_dataset(dest, proxy_options) == manifest


def test_move_of_a_large_object_uses_a_multipart_copy(
    proxy_options: dict[str, Any],
    fault_proxy: FaultProxy,
    moto_fs: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import s3fs.core

    # s3fs copies objects above this size part by part (S3 refuses one CopyObject over 5 GB);
    # lowered here so the test needs megabytes, not gigabytes.
    monkeypatch.setattr(s3fs.core, "MANAGED_COPY_THRESHOLD", 2**20)
    data = payload(3 * 2**20, seed=5)
    source, target = f"{BUCKET}/big/_state/part.tar", f"{BUCKET}/big/shard-000000.tar"
    moto_fs.pipe_file(source, data)
    Store(f"s3://{BUCKET}", proxy_options).move(
        source.removeprefix(f"{BUCKET}/"), target.removeprefix(f"{BUCKET}/")
    )
    assert fault_proxy.count("POST", "?uploads") == 1  # CreateMultipartUpload, then part copies
    assert fault_proxy.count("GET", "part.tar") == 0
    moto_fs.invalidate_cache()
    assert moto_fs.cat_file(target) == data and not moto_fs.exists(source)


def test_memory_build_leaves_no_state_folder(
    make_image_folder: Callable[..., pathlib.Path],
) -> None:
    images = make_image_folder(num_classes=2, per_class=3)
    dest = f"memory://finalize-{uuid.uuid4().hex}"
    try:
        manifest = build_shards(images, dest, max_samples_per_shard=4)
        found = fsspec.filesystem("memory").ls(dest[9:], detail=False)
        listed = sorted(path.rsplit("/", 1)[-1] for path in found)
        assert listed == sorted(
            [
                "_info.json",
                "manifest.json",
                *(n for s in manifest.shards for n in (s.name, s.index)),
            ]
        )
    finally:
        Store(dest).remove_folder()


def test_finalize_moves_in_parallel_and_resumes_after_a_failed_move(
    make_image_folder: Callable[..., pathlib.Path],
    storage_options: dict[str, Any],
    moto_fs: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    images = make_image_folder(num_classes=3, per_class=10)
    clean = build_shards(images, f"s3://{BUCKET}/clean", storage_options=storage_options,
                         max_samples_per_shard=3)  # fmt: skip
    dest = f"s3://{BUCKET}/resumed"
    real_move, lock, calls, threads = Store.move, threading.Lock(), [0], set()

    def failing_move(self: Store, source: str, target: str, into: Store | None = None) -> None:
        with lock:
            calls[0] += 1
            number = calls[0]
            threads.add(threading.get_ident())
        if number == 7:
            raise OSError("the network went away mid-finalize")
        real_move(self, source, target, into)

    with monkeypatch.context() as patch:
        patch.setattr(Store, "move", failing_move)
        with pytest.raises(OSError, match="mid-finalize"):
            build_shards(images, dest, storage_options=storage_options, max_samples_per_shard=3)
    assert len(threads) > 1, "moves ran on several threads"
    moto_fs.invalidate_cache()
    assert not moto_fs.exists(f"{BUCKET}/resumed/manifest.json")
    moved = [p for p in moto_fs.find(f"{BUCKET}/resumed") if "/shard-" in p]
    assert 0 < len(moved) < 2 * len(clean.shards), "the failure left a half-finalized build"
    manifest = build_shards(images, dest, storage_options=storage_options, max_samples_per_shard=3)
    assert manifest.shards == clean.shards
    assert verify_dataset(dest, storage_options) == manifest
    moto_fs.invalidate_cache()
    assert not [p for p in moto_fs.find(f"{BUCKET}/resumed") if "_shardstream_build" in p]
