"""Remote reads through a real S3 server and a fault proxy: every fault ends in identical bytes."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest

from shardstream._storage import ReadOptions, Store
from shardstream.errors import StorageError
from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import BUCKET, SECRET_KEY, payload

SIZE = 3 * 2**20 + 12345  # a few MiB, not a multiple of any chunk size
URL = f"s3://{BUCKET}/data/shard-000000.tar"
KEY = f"/{BUCKET}/data/shard-000000.tar"

#: Fast retries and a short stall timeout, so fault tests take well under a second each.
FAST = ReadOptions(
    max_attempts=4, backoff_s=0.01, max_backoff_s=0.05, timeout_s=1.0, read_ahead_bytes=2**20
)


@pytest.fixture
def data(moto_fs: Any) -> bytes:
    blob = payload(SIZE)
    moto_fs.pipe(URL, blob)
    return blob


def read_all(options: dict[str, Any], read_options: ReadOptions, piece: int = 10_000) -> bytes:
    """Read like tarfile does: many small reads."""
    parts = []
    with Store(URL, options, read_options).open_read() as stream:
        while chunk := stream.read(piece):
            parts.append(chunk)
        assert stream.tell() == sum(map(len, parts))
    return b"".join(parts)


#: Ranged GETs of a fault-free read: a 64 KiB opening span, then spans of one read-ahead chunk
#: (read_ahead_bytes / 4 = 256 KiB here), each read whole so its connection is reused.
FAULT_FREE_GETS = 1 + -(-(SIZE - 64 * 2**10) // (256 * 2**10))


def test_fault_free_read_uses_few_long_gets(
    data: bytes, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    assert read_all(proxy_options, FAST) == data
    assert fault_proxy.count("GET", KEY) == FAULT_FREE_GETS, "no request per small read"
    assert fault_proxy.count("HEAD", KEY) == 0, "size and ETag come from the first ranged GET"


@pytest.mark.parametrize("read_ahead_bytes", [0, 2**20])
@pytest.mark.parametrize(
    "fault",
    [
        {"action": "reset", "after_bytes": 1_500_000},
        {"action": "reset", "after_bytes": 0},
        {"action": "cut", "after_bytes": 1_000_001},
        {"action": "503"},
        {"action": "stall", "after_bytes": 700_000, "stall_s": 3.0},
    ],
    ids=["reset-mid-body", "reset-before-response", "cut-body", "503-slowdown", "stall-mid-body"],
)
@pytest.mark.usefixtures("store_latency")
def test_faults_mid_object_give_identical_bytes(
    data: bytes,
    proxy_options: dict[str, Any],
    fault_proxy: FaultProxy,
    fault: dict[str, Any],
    read_ahead_bytes: int,
) -> None:
    # The second GET (bytes 1 MiB to 3 MiB) breaks, so the fault lands in the middle of the object.
    rule = fault_proxy.add(method="GET", path_contains=KEY, nth=2, **fault)
    options = ReadOptions(**{**vars(FAST), "read_ahead_bytes": read_ahead_bytes})
    started = time.monotonic()
    assert read_all(proxy_options, options) == data
    assert rule.hits == 1, "the fault was injected"
    assert fault_proxy.count("GET", KEY) <= FAULT_FREE_GETS + 1, "one retry, resumed in place"
    assert time.monotonic() - started < 3.0, "a stall is cut short by timeout_s"


@pytest.mark.usefixtures("store_latency")
def test_attempt_budget_restarts_after_progress(
    data: bytes, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    # Every GET stalls after 600 KB: each try moves the offset on, so several failures in
    # total do not exhaust a budget of two tries in a row.
    rule = fault_proxy.add(
        method="GET", path_contains=KEY, action="stall", after_bytes=600_000, stall_s=2.0,
        times=0,
    )  # fmt: skip
    options = ReadOptions(**{**vars(FAST), "max_attempts": 2, "timeout_s": 0.3})
    assert read_all(proxy_options, options, piece=65_536) == data
    assert rule.hits >= 4


def test_retry_budget_exhausted_names_object_not_secret(
    data: bytes,
    proxy_options: dict[str, Any],
    fault_proxy: FaultProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fault_proxy.add(method="GET", path_contains=KEY, action="503", times=0)
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StorageError) as caught:
        read_all(proxy_options, FAST)
    message = str(caught.value)
    assert URL in message and "4 attempts" in message and "SlowDown" in message
    assert "byte offset 0" in message
    assert fault_proxy.count("GET", KEY) == FAST.max_attempts, "botocore does not retry too"
    assert SECRET_KEY not in message
    assert SECRET_KEY not in caplog.text
    assert "retrying" in caplog.text


def test_missing_object_fails_fast_without_retries(
    proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    started = time.monotonic()
    with pytest.raises(FileNotFoundError) as caught:
        Store(f"s3://{BUCKET}/nope.tar", proxy_options, FAST).open_read()
    assert f"s3://{BUCKET}/nope.tar" in str(caught.value)
    assert fault_proxy.count("GET", "/nope.tar") == 1
    assert time.monotonic() - started < 2.0


def test_secret_in_storage_options_never_leaks(
    data: bytes,
    proxy_options: dict[str, Any],
    fault_proxy: FaultProxy,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # botocore's own debug logs included
    fault_proxy.add(method="GET", path_contains=KEY, action="reset", after_bytes=1000)
    assert read_all(proxy_options, FAST) == data
    with pytest.raises(FileNotFoundError) as caught:
        Store(f"s3://{BUCKET}/missing.tar", proxy_options, FAST).open_read()
    assert SECRET_KEY not in str(caught.value) and SECRET_KEY not in repr(caught.value)
    assert "retrying" in caplog.text
    assert SECRET_KEY not in caplog.text


def test_secrets_in_urls_are_redacted_from_messages() -> None:
    from shardstream._storage import redact_options, redact_text

    url = f"https://user:{SECRET_KEY}@host/b/k?X-Amz-Signature={SECRET_KEY}&part=1"
    assert redact_text(url) == "https://***@host/b/k?X-Amz-Signature=***&part=1"
    options = {"key": "AKIA1234", "secret": SECRET_KEY, "client_kwargs": {"token": "tok-1234"}}
    assert SECRET_KEY not in str(redact_options(options))
    assert redact_text(f"failed with {SECRET_KEY}", [SECRET_KEY]) == "failed with ***"


def test_read_ahead_is_bounded_and_stops_on_close(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    blob = payload(32 * 2**20, seed=1)
    moto_fs.pipe(URL, blob)
    options = ReadOptions(read_ahead_bytes=2**20, timeout_s=5.0)
    before = threading.active_count()
    stream: Any = Store(URL, proxy_options, options).open_read()
    assert stream.read(100) == blob[:100]
    time.sleep(0.5)  # let the background thread fill its queue
    assert stream.extent_source.buffered_bytes <= options.read_ahead_bytes
    # Socket buffers hold some more, but nowhere near the whole object.
    assert fault_proxy.sent_bytes() < len(blob) // 2
    stream.close()
    assert not stream.extent_source.alive
    assert threading.active_count() <= before + 1  # at most fsspec's shared event-loop thread


@pytest.mark.usefixtures("store_latency")
def test_read_ahead_propagates_errors_without_hanging(
    data: bytes, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    # The open's own first GET succeeds; every later one (the read-ahead thread's) fails.
    fault_proxy.add(method="GET", path_contains=KEY, action="reset", after_bytes=0, nth=2, times=0)
    stream = Store(URL, proxy_options, FAST).open_read()
    with pytest.raises(StorageError, match=r"after 4 attempts.*(Connection|reset)"):
        stream.read()
    stream.close()


def test_tarfile_stream_mode_works_on_remote_stream(
    moto_fs: Any, proxy_options: dict[str, Any]
) -> None:
    import io
    import tarfile

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for index in range(50):
            member = payload(30_000 + index, seed=index)
            info = tarfile.TarInfo(f"{index:04d}.bin")
            info.size = len(member)
            tar.addfile(info, io.BytesIO(member))
    moto_fs.pipe(URL, buffer.getvalue())
    with (
        Store(URL, proxy_options, FAST).open_read() as stream,
        tarfile.open(fileobj=stream, mode="r|*") as tar,
    ):
        names = [member.name for member in tar]
    assert names == [f"{index:04d}.bin" for index in range(50)]


def test_seek_forward_backward_and_far(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    blob = payload(16 * 2**20, seed=2)
    moto_fs.pipe(URL, blob)
    with Store(URL, proxy_options, FAST).open_read() as stream:
        assert stream.seekable()
        assert stream.read(10) == blob[:10]
        assert stream.seek(5000, 1) == 5010  # a short hop reads on
        assert stream.read(10) == blob[5010:5020]
        gets = fault_proxy.count("GET", KEY)
        assert stream.seek(12 * 2**20) == 12 * 2**20  # a long jump: one new ranged GET
        assert stream.read(100) == blob[12 * 2**20 : 12 * 2**20 + 100]
        assert fault_proxy.count("GET", KEY) == gets + 1
        assert stream.seek(100) == 100  # backwards
        assert stream.read(1000) == blob[100:1100]
        assert stream.seek(-10, 2) == len(blob) - 10
        assert stream.read() == blob[-10:]
        assert stream.read(5) == b""


def test_a_short_piece_fetches_little_and_many_open_streams_do_not_stall(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    blob = payload(12 * 2**20, seed=2)
    moto_fs.pipe(URL, blob)
    options = ReadOptions(timeout_s=5.0, max_attempts=2)  # default 32 MiB read-ahead
    # Like the streaming reader's pieces: peek at byte 0, seek into the shard, read a little,
    # with more streams open at once than the client's connection pool (10) holds.
    streams = [Store(URL, proxy_options, options).open_read() for _ in range(16)]
    try:
        for number, stream in enumerate(streams):
            assert stream.read(2) == blob[:2]
            stream.seek(number * 600_000)
        for number, stream in enumerate(streams):
            start = number * 600_000
            assert stream.read(300_000) == blob[start : start + 300_000]
    finally:
        for stream in streams:
            stream.close()
    assert fault_proxy.sent_bytes() < 16 * (64 * 2**10 + 2**20 + 2 * 2**20)


@pytest.mark.parametrize("read_ahead_bytes", [0, 2**20])
def test_ranged_read_fetches_only_its_range_in_one_get(
    data: bytes, proxy_options: dict[str, Any], fault_proxy: FaultProxy, read_ahead_bytes: int
) -> None:
    options = ReadOptions(**{**vars(FAST), "read_ahead_bytes": read_ahead_bytes})
    start, end = 1_000_000, 1_200_000
    with Store(URL, proxy_options, options).open_read(start=start, end=end) as stream:
        assert stream.read() == data[start:end]
    assert fault_proxy.count("GET", KEY) == 1 and fault_proxy.count("HEAD", KEY) == 0
    assert fault_proxy.sent_bytes() == end - start, "nothing prefetched past the range"


@pytest.mark.usefixtures("store_latency")
def test_ranged_read_resumes_inside_its_range_after_a_reset(
    data: bytes, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    rule = fault_proxy.add(method="GET", path_contains=KEY, action="reset", after_bytes=70_000)
    start, end = 500_000, 700_000
    with Store(URL, proxy_options, FAST).open_read(start=start, end=end) as stream:
        assert stream.read() == data[start:end]
    assert rule.hits == 1


def test_ranged_read_past_the_end_of_a_shorter_object(
    data: bytes, proxy_options: dict[str, Any]
) -> None:
    with Store(URL, proxy_options, FAST).open_read(start=SIZE - 100, end=SIZE + 5000) as stream:
        assert stream.read() == data[-100:]
    with Store(URL, proxy_options, FAST).open_read(start=SIZE + 10, end=SIZE + 5000) as stream:
        assert stream.read() == b""


def test_receive_buffers_are_reused_across_gets(
    moto_fs: Any, storage_options: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardstream._storage.background import ProcessLocal
    from shardstream._storage.remote import buffers

    pool = buffers.ReceiveBuffers(max_bytes=64 * 2**20)
    monkeypatch.setattr(buffers, "RECEIVE_BUFFERS", ProcessLocal(lambda: pool))
    blob = payload(40 * 2**20 + 777, seed=3)
    moto_fs.pipe(URL, blob)
    plain = ReadOptions(read_ahead_bytes=0)  # one 8 MiB GET after another, in this thread
    assert read_all(storage_options, plain, piece=1_000_003) == blob
    assert pool.reused >= 3, "later GETs were read into the buffers of earlier ones"
    prefetched = ReadOptions()  # spans fetched by the shared pool's threads
    assert read_all(storage_options, prefetched, piece=65_536) == blob


def test_gets_go_to_presigned_urls_whose_signatures_never_reach_messages(
    data: bytes, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    assert read_all(proxy_options, FAST) == data
    targets = [t for m, t in fault_proxy.requests if m == "GET" and KEY in t]
    assert targets and all("X-Amz-Signature=" in t for t in targets), "signed once, sent plain"
    fault_proxy.add(method="GET", path_contains=KEY, action="reset", times=0)
    with pytest.raises(StorageError) as caught:
        read_all(proxy_options, FAST)
    message = str(caught.value)
    assert URL in message and "4 attempts" in message
    assert "Signature" not in message and "Credential" not in message and "?" not in message


@pytest.mark.usefixtures("store_latency")
def test_a_refused_presigned_url_is_signed_again(
    data: bytes, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    # An expired URL (or one signed with credentials since rotated) gets 403: that GET is sent
    # once more through get_object (header-signed, fresh credentials) and the read goes on.
    refused = fault_proxy.add(method="GET", path_contains="X-Amz-Signature", action="403")
    assert read_all(proxy_options, FAST) == data
    assert refused.hits == 1
    gets = [t for m, t in fault_proxy.requests if m == "GET" and KEY in t]
    assert "X-Amz-Signature" in gets[0] and "X-Amz-Signature" not in gets[1]
    assert all("X-Amz-Signature" in t for t in gets[2:]), "later GETs use a new URL"


def test_access_denied_for_real_is_not_retried(
    data: bytes, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    fault_proxy.add(method="GET", path_contains=KEY, action="403", times=0)
    with pytest.raises(PermissionError) as caught:
        read_all(proxy_options, FAST)
    assert URL in str(caught.value) and "access denied" in str(caught.value)
    assert fault_proxy.count("GET", KEY) == 2  # the presigned GET, then get_object


def test_keys_needing_escapes_read_through_presigned_urls(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    url = f"s3://{BUCKET}/odd names/a b+c=d&e/shärd 1%.tar"
    blob = payload(3 * 2**20 + 5, seed=9)
    moto_fs.pipe(url, blob)
    with Store(url, proxy_options, FAST).open_read() as stream:
        assert stream.read() == blob
    assert any("X-Amz-Signature" in t for m, t in fault_proxy.requests if m == "GET")


def test_anonymous_reads_send_unsigned_gets(
    data: bytes, moto_fs: Any, fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    moto_fs.call_s3("put_object_acl", Bucket=BUCKET, Key=KEY.split("/", 2)[2], ACL="public-read")
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    anonymous = {"endpoint_url": fault_proxy.endpoint_url, "anon": True}
    assert read_all(anonymous, FAST) == data
    gets = [t for m, t in fault_proxy.requests if m == "GET" and KEY in t]
    assert gets and not any("Signature" in t or "Credential" in t for t in gets)


def test_a_piece_sized_range_is_one_get_and_a_long_range_is_split(
    moto_fs: Any, proxy_options: dict[str, Any], fault_proxy: FaultProxy
) -> None:
    blob = payload(20 * 2**20, seed=9)
    moto_fs.pipe(URL, blob)
    store = Store(f"s3://{BUCKET}/data", proxy_options)
    for start, end, most in [(1000, 1000 + 2 * 2**20 + 5, 1), (0, 16 * 2**20, None)]:
        fault_proxy.clear()
        with store.open_read("shard-000000.tar", start, end) as stream:
            assert stream.read() == blob[start:end]
        gets = fault_proxy.count("GET", KEY)
        if most is not None:
            assert gets == most, "a piece (about 2 MiB) costs one request, as a plain GET would"
        else:
            assert gets > 2, "a long range: first MiB, then spans fetched side by side"
