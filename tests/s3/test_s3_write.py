"""Atomic multipart writes to S3 and prefix listings, against a real S3 server."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import tracemalloc
from typing import Any

import pytest

from shardstream._storage import Store
from tests.s3.s3env import BUCKET

PART = 5 * 2**20  # S3's smallest part size


def uploads_in_progress(moto_fs: Any) -> list[dict[str, Any]]:
    response = moto_fs.call_s3("list_multipart_uploads", Bucket=BUCKET)
    return list(response.get("Uploads", []))


def write_measured(url: str, options: dict[str, Any], num_pieces: int) -> tuple[int, str]:
    """Write ``num_pieces`` x 256 KiB; return the peak traced memory and the sha256."""
    digest = hashlib.sha256()
    piece = os.urandom(256 * 2**10)
    tracemalloc.start()
    try:
        with Store(url, options).open_atomic_write("", part_size_bytes=PART) as stream:
            for _ in range(num_pieces):
                stream.write(piece)
                digest.update(piece)
        return tracemalloc.get_traced_memory()[1], digest.hexdigest()
    finally:
        tracemalloc.stop()


def test_large_object_is_uploaded_in_parts_with_bounded_memory(
    storage_options: dict[str, Any], moto_fs: Any
) -> None:
    small, large = f"s3://{BUCKET}/big/small.tar", f"s3://{BUCKET}/big/large.tar"
    write_measured(small, storage_options, 1)  # warm up: the client loads its API models once
    small_peak, _ = write_measured(small, storage_options, 44)  # 11 MiB, 3 parts
    large_peak, digest = write_measured(large, storage_options, 176)  # 44 MiB, 9 parts
    assert large_peak < small_peak + PART, "memory follows the part size, not the object size"
    assert large_peak < 5 * PART
    # A multipart object's ETag ends in "-<number of parts>": 8 parts of 5 MiB + 4 MiB.
    assert moto_fs.info(large)["ETag"].strip('"').endswith("-9")
    assert hashlib.sha256(moto_fs.cat_file(large)).hexdigest() == digest
    assert uploads_in_progress(moto_fs) == []


@pytest.mark.parametrize("num_bytes", [1000, 2 * PART + 1], ids=["single-put", "multipart"])
def test_error_mid_write_leaves_nothing_visible(
    storage_options: dict[str, Any], moto_fs: Any, num_bytes: int
) -> None:
    url = f"s3://{BUCKET}/broken/shard-000000.tar"
    with (
        pytest.raises(RuntimeError),
        Store(url, storage_options).open_atomic_write("", part_size_bytes=PART) as stream,
    ):
        stream.write(b"x" * num_bytes)
        raise RuntimeError("the build failed mid-shard")
    assert not moto_fs.exists(url)
    assert not Store(url, storage_options).exists()
    assert uploads_in_progress(moto_fs) == [], "the multipart upload was aborted"


def test_killed_writer_leaves_no_visible_object(
    storage_options: dict[str, Any], moto_fs: Any
) -> None:
    url = f"s3://{BUCKET}/killed/shard-000000.tar"
    script = textwrap.dedent(
        f"""
        import sys, time
        from shardstream._storage import Store
        store = Store({url!r}, {storage_options!r})
        with store.open_atomic_write("", part_size_bytes={PART}) as f:
            f.write(b"y" * {2 * PART + 10})
            f.flush()
            print("parts-uploaded", flush=True)
            time.sleep(60)
        """
    )
    process = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, env=os.environ.copy()
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"parts-uploaded"
        assert uploads_in_progress(moto_fs), "the upload had started"
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(10)
        process.stdout.close()  # type: ignore[union-attr]
    assert not moto_fs.exists(url)
    assert Store(f"s3://{BUCKET}/killed", storage_options).list_names() == []


def test_list_names_and_exists_work_on_prefixes(
    storage_options: dict[str, Any], moto_fs: Any
) -> None:
    base = f"s3://{BUCKET}/data/set1"
    assert Store(base, storage_options).list_names() == []
    assert not Store(base, storage_options).exists("manifest.json")
    for name in ("shard-000001.tar", "shard-000000.tar", "sub/other.tar"):
        with Store(base, storage_options).open_atomic_write(name) as stream:
            stream.write(b"data")
    shards = ["shard-000000.tar", "shard-000001.tar"]
    assert Store(base, storage_options).list_names() == shards
    assert Store(base + "/", storage_options).list_names() == shards
    # Another client writes: listings and existence checks see it at once (no stale cache).
    moto_fs.pipe(f"{base}/manifest.json", b"{}")
    assert Store(base, storage_options).exists("manifest.json")
    assert "manifest.json" in Store(base, storage_options).list_names()
    assert Store(base, storage_options).size("shard-000000.tar") == 4
    Store(base, storage_options).remove("manifest.json")
    assert not Store(base, storage_options).exists("manifest.json")
    assert Store(base, storage_options).read_bytes("shard-000001.tar") == b"data"
