"""Finishing a build on object stores: parts are moved server-side, the state prefix goes away."""

from __future__ import annotations

import pathlib
import uuid
from collections.abc import Callable
from typing import Any

import fsspec
import pytest

from shardstream import build_shards
from shardstream.format.verify import verify_dataset
from shardstream.storage import Store
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
