"""Identical output for any executor, and kill-and-resume with a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from shardstream.shardwriter import build_shards
from tests.daskcluster import dask_client

from .helpers import dataset_bytes


@pytest.mark.slow
def test_one_and_three_workers_give_identical_bytes(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=4, per_class=15, png_every=3)
    build_shards(root, tmp_path / "one", max_samples_per_shard=7, workers=1)
    build_shards(root, tmp_path / "three", max_samples_per_shard=7, workers=3)
    one, three = dataset_bytes(tmp_path / "one"), dataset_bytes(tmp_path / "three")
    # 9 shards, their 9 byte-offset indexes (.idx), timm's _info.json and the manifest
    assert len(one) == 20 and one == three
    assert sum(name.endswith(".idx") for name in one) == 9


@pytest.mark.slow
def test_resize_output_identical_across_workers(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=2, per_class=10, size=(64, 48))
    options = {"resize": 24, "max_bytes_per_shard": 8_000}
    build_shards(root, tmp_path / "one", workers=1, **options)
    build_shards(root, tmp_path / "two", workers=2, **options)
    assert dataset_bytes(tmp_path / "one") == dataset_bytes(tmp_path / "two")


@pytest.mark.slow
def test_dask_local_cluster_executor(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=3, per_class=8)
    build_shards(root, tmp_path / "local", max_samples_per_shard=5)
    with dask_client() as client:
        build_shards(
            root,
            tmp_path / "dask",
            max_samples_per_shard=5,
            workers=2,
            executor=client.get_executor(),
        )
    assert dataset_bytes(tmp_path / "dask") == dataset_bytes(tmp_path / "local")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "shardstream", "build", *args]


@pytest.mark.slow
def test_sigkill_then_rerun_gives_the_uninterrupted_dataset(make_image_folder, tmp_path):
    root = make_image_folder(num_classes=4, per_class=60, size=(48, 40), png_every=5)
    args = [str(root), "--max-samples-per-shard", "3", "--quiet"]
    subprocess.run(_cli(*args, str(tmp_path / "clean")), check=True, timeout=120)
    dest = tmp_path / "killed"
    state = dest / "_shardstream_build"
    process = subprocess.Popen(_cli(*args, str(dest)))
    deadline = time.monotonic() + 60
    while not any(state.glob("chunk-*.json")) if state.exists() else True:
        assert process.poll() is None, "the build finished before it could be killed"
        assert time.monotonic() < deadline
        time.sleep(0.002)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    assert not (dest / "manifest.json").exists()
    with pytest.raises(Exception, match="no manifest"):
        from shardstream._format.manifest import read_manifest

        read_manifest(str(dest))
    subprocess.run(_cli(*args, str(dest)), check=True, timeout=120)
    assert dataset_bytes(dest) == dataset_bytes(tmp_path / "clean")
    assert not state.exists()
