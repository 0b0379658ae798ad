"""Uploads on the plain botocore client: parts in flight, retries, aborts (moto + fault proxy)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import pytest

from shardstream._storage import ReadOptions, Store
from shardstream._storage.backends.s3client import S3Upload
from shardstream._storage.remote.retry import retries_in_process
from shardstream.errors import StorageError
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET, SECRET_KEY
from tests.s3.test_s3_write import PART, uploads_in_progress

FAST_RETRIES = ReadOptions(max_attempts=3, backoff_s=0.01, max_backoff_s=0.02)


def write(url: str, options: dict[str, Any], data: bytes, piece: int = 300_000) -> None:
    store = Store(url, options, FAST_RETRIES)
    with store.open_atomic_write("", part_size_bytes=PART) as stream:
        assert isinstance(stream, S3Upload), "S3 writes go through the plain client"
        for start in range(0, len(data), piece):
            assert stream.write(data[start : start + piece]) == len(data[start : start + piece])
        assert stream.tell() == len(data)


def test_parts_and_single_puts_go_out_on_the_plain_client(
    proxy_options: dict[str, Any], fault_proxy: FaultProxy, moto_fs: Any
) -> None:
    data = os.urandom(3 * PART + 12345)
    write(f"s3://{BUCKET}/up/big.tar", proxy_options, data)
    write(f"s3://{BUCKET}/up/small.tar", proxy_options, data[:1000])
    write(f"s3://{BUCKET}/up/empty.tar", proxy_options, b"")
    assert moto_fs.cat_file(f"{BUCKET}/up/big.tar") == data
    assert moto_fs.cat_file(f"{BUCKET}/up/small.tar") == data[:1000]
    assert moto_fs.cat_file(f"{BUCKET}/up/empty.tar") == b""
    assert moto_fs.info(f"{BUCKET}/up/big.tar")["ETag"].strip('"').endswith("-4")
    assert fault_proxy.count("POST", "big.tar?uploads") == 1
    assert fault_proxy.count("PUT", "big.tar?") == 4  # UploadPart x4
    assert fault_proxy.count("PUT", "small.tar") == 1  # one PutObject, no multipart
    assert uploads_in_progress(moto_fs) == []


@pytest.mark.usefixtures("store_latency")
def test_transient_faults_on_parts_are_retried(
    proxy_options: dict[str, Any], fault_proxy: FaultProxy, moto_fs: Any
) -> None:
    slow = fault_proxy.add(action="503", method="PUT", path_contains="partNumber=2")
    reset = fault_proxy.add(action="reset", method="PUT", path_contains="partNumber=3")
    first_put = fault_proxy.add(action="503", method="PUT", path_contains="small.tar")
    before = retries_in_process()
    data = os.urandom(4 * PART)
    write(f"s3://{BUCKET}/faulty/big.tar", proxy_options, data)
    write(f"s3://{BUCKET}/faulty/small.tar", proxy_options, data[:5000])
    assert (slow.hits, reset.hits, first_put.hits) == (1, 1, 1)
    assert retries_in_process() - before == 3
    digest = hashlib.sha256(moto_fs.cat_file(f"{BUCKET}/faulty/big.tar")).digest()
    assert digest == hashlib.sha256(data).digest()
    assert moto_fs.cat_file(f"{BUCKET}/faulty/small.tar") == data[:5000]
    assert uploads_in_progress(moto_fs) == []


@pytest.mark.usefixtures("store_latency")
def test_a_lost_completion_answer_is_accepted(
    proxy_options: dict[str, Any], fault_proxy: FaultProxy, moto_fs: Any
) -> None:
    # The server completes the upload, then the answer is cut: the retry finds no such upload
    # and checks that the object is there with every part.
    lost = fault_proxy.add(action="reset", method="POST", path_contains="uploadId=",
                           after_bytes=20)  # fmt: skip
    data = os.urandom(2 * PART + 1)
    write(f"s3://{BUCKET}/lost/big.tar", proxy_options, data)
    assert lost.hits == 1
    assert fault_proxy.count("POST", "big.tar?uploadId=") == 2
    assert moto_fs.cat_file(f"{BUCKET}/lost/big.tar") == data


@pytest.mark.usefixtures("store_latency")
def test_a_part_failing_every_try_aborts_and_names_the_object(
    proxy_options: dict[str, Any], fault_proxy: FaultProxy, moto_fs: Any
) -> None:
    fault_proxy.add(action="503", method="PUT", path_contains="partNumber=2", times=0)
    url = f"s3://{BUCKET}/failing/shard-000000.tar"
    with pytest.raises(StorageError) as caught:
        write(url, proxy_options, os.urandom(3 * PART))
    message = str(caught.value)
    assert url in message and "uploading part 2" in message and "3 attempts" in message
    assert f"byte offset {PART}" in message
    assert SECRET_KEY not in message
    assert not moto_fs.exists(url)
    assert uploads_in_progress(moto_fs) == [], "the multipart upload was aborted"
    assert fault_proxy.count("DELETE", "shard-000000.tar?uploadId=") == 1


def test_writes_after_a_failed_part_raise_at_once(
    proxy_options: dict[str, Any], fault_proxy: FaultProxy, moto_fs: Any
) -> None:
    fault_proxy.add(action="503", method="PUT", path_contains="partNumber=1", times=0)
    url = f"s3://{BUCKET}/stopped/shard.tar"
    upload = Store(url, proxy_options, FAST_RETRIES).open_atomic_write("", part_size_bytes=PART)
    with pytest.raises(StorageError), upload as stream:
        # One part fails while the next ones are written: with two in flight, the third part
        # waits for the first and gets its error; nothing past that is sent.
        for _ in range(10):
            stream.write(b"z" * PART)
    assert fault_proxy.count("PUT", "partNumber=4") == 0
    assert not moto_fs.exists(url)
    assert uploads_in_progress(moto_fs) == []


def test_memory_is_bounded_by_parts_in_flight(storage_options: dict[str, Any]) -> None:
    # Each write is a part; the writer may hold the part being filled plus two in flight.
    store = Store(f"s3://{BUCKET}/bounded/x.tar", storage_options)
    with store.open_atomic_write("", part_size_bytes=PART) as stream:
        upload = stream
        assert isinstance(upload, S3Upload)
        for _ in range(6):
            stream.write(b"q" * PART)
            assert len(upload._parts) <= upload.max_in_flight
            assert len(upload._buffer) < PART
