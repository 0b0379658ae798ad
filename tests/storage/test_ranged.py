"""ExtentFetcher, RemoteStream and BoundedFile over an in-memory object that fails where told.

Every read is compared byte for byte with the object, so a byte lost or repeated at a resume
shows; the fake records where each ranged request started, so resuming at the exact offset does.
"""

from __future__ import annotations

import io
import multiprocessing
import pathlib
import re
import tarfile
import warnings

import pytest

from shardstream._storage.ranges import BoundedFile
from shardstream._storage.remote.ranged import ExtentFetcher, ExtentSource, ReadAhead, RemoteStream
from shardstream._storage.remote.retry import Retrier
from shardstream.errors import StorageError
from tests.storage.fakes import FakeObject, Fault, random_bytes

URL = "s3://bucket/train/shard-000001.tar"
SIZE = 50_000
DATA = random_bytes(SIZE)
EXTENT = 1000


def fetcher_for(
    source: FakeObject,
    size: int | None = SIZE,
    *,
    max_attempts: int = 4,
    start: int = 0,
    limit: int | None = None,
    extent_bytes: int = EXTENT,
    first_span_bytes: int = 1500,
    max_span_bytes: int = 6000,
) -> ExtentFetcher:
    retrier = Retrier(URL, "reading", max_attempts, backoff_s=0.0, max_backoff_s=0.0)
    return ExtentFetcher(
        source, size, extent_bytes, retrier, first_span_bytes, max_span_bytes, start, limit
    )


def drain(fetcher: ExtentFetcher, into: list[bytes] | None = None) -> bytes:
    extents = [] if into is None else into
    while (extent := fetcher.next_extent()) is not None:
        assert 0 < len(extent) <= fetcher.extent_bytes
        extents.append(extent)
    return b"".join(extents)


def stream_over(
    source: FakeObject,
    read_ahead: bool,
    size: int = SIZE,
    *,
    start: int = 0,
    head: bytes = b"",
    max_attempts: int = 4,
    extent_bytes: int = EXTENT,
    max_span_bytes: int = 6000,
) -> RemoteStream:
    """A RemoteStream as ``open_remote`` builds it: fetcher, optional read-ahead, head bytes."""
    fetcher = fetcher_for(
        source,
        size,
        start=start + len(head),
        max_attempts=max_attempts,
        extent_bytes=extent_bytes,
        first_span_bytes=min(1500, extent_bytes),
        max_span_bytes=max_span_bytes,
    )
    extents: ExtentSource = fetcher
    if read_ahead:
        extents = ReadAhead(fetcher, 8 * extent_bytes, extent_bytes, fetcher.retrier.stop)
    return RemoteStream(extents, URL, size, start, head)


def test_spans_grow_to_the_cap_and_cover_the_object_once() -> None:
    source = FakeObject(DATA)
    assert drain(fetcher_for(source)) == DATA
    starts = [offset for offset, _ in source.opens]
    spans = [end - offset for offset, end in source.opens]
    assert spans[:4] == [1500, 3000, 6000, 6000]
    assert all(span <= 6000 for span in spans)
    assert starts == [0] + [end for _, end in source.opens[:-1]], "contiguous, no overlap"
    assert source.opens[-1][1] == SIZE and source.open_bodies == 0


FAULT_SETS = {
    "reset mid-extent": [Fault(12_345, "reset")],
    "reset at a request boundary": [Fault(1500, "reset")],
    "short read at byte 0": [Fault(0, "cut")],
    "stall on the last byte": [Fault(SIZE - 1, "stall")],
    "slowdown on the resumed request": [Fault(7_777, "reset"), Fault(7_777, "open-503")],
    "many": [Fault(o, k) for o, k in [(999, "cut"), (1000, "reset"), (20_001, "stall"),
                                      (33_333, "cut"), (40_000, "stall"), (40_000, "open-503"),
                                      (49_000, "reset")]],
}  # fmt: skip


@pytest.mark.parametrize("faults", FAULT_SETS.values(), ids=FAULT_SETS.keys())
def test_faults_neither_lose_nor_repeat_a_byte(faults: list[Fault]) -> None:
    source = FakeObject(DATA, [Fault(f.offset, f.kind, f.times) for f in faults])
    fetcher = fetcher_for(source)
    assert drain(fetcher) == DATA
    assert len(source.fired) == len(faults), "every planned fault happened"
    assert fetcher.retrier.total_failures == len(faults)
    starts = [offset for offset, _ in source.opens]
    assert starts == sorted(starts), "no byte was asked for twice"
    for fault in faults:
        assert fault.offset in starts, f"no request resumed at byte {fault.offset}"
    assert source.open_bodies == 0, "every response was closed"


def test_a_persistent_fault_gives_up_after_max_attempts() -> None:
    source = FakeObject(DATA, [Fault(20_000, "reset", times=100)])
    fetcher = fetcher_for(source, max_attempts=3)
    received: list[bytes] = []
    with pytest.raises(StorageError) as caught:
        drain(fetcher, received)
    assert b"".join(received) == DATA[:20_000], "every byte before the fault was delivered"
    message = str(caught.value)
    assert URL in message and "byte offset 20000 of 50000" in message and "3 attempts" in message
    assert [offset for offset, _ in source.opens].count(20_000) == 2
    assert source.open_bodies == 0


def test_spread_out_faults_beyond_the_budget_are_all_survived() -> None:
    faults = [Fault(offset, "reset") for offset in range(2_500, SIZE, 5_000)]
    fetcher = fetcher_for(FakeObject(DATA, faults), max_attempts=2)
    assert drain(fetcher) == DATA
    assert fetcher.retrier.total_failures == len(faults) == 10


@pytest.mark.parametrize(
    ("fault", "expected"),
    [(Fault(0, "open-missing"), FileNotFoundError), (Fault(30_000, "denied"), PermissionError)],
)
def test_fatal_errors_are_raised_without_a_retry(
    fault: Fault, expected: type[BaseException]
) -> None:
    source = FakeObject(DATA, [Fault(fault.offset, fault.kind, times=100)])
    received: list[bytes] = []
    with pytest.raises(expected, match=re.escape(URL)):
        drain(fetcher_for(source), received)
    assert len(source.fired) == 1
    assert b"".join(received) == DATA[: fault.offset]


def test_the_size_is_learnt_from_the_first_response() -> None:
    fetcher = fetcher_for(FakeObject(DATA, publish_size=True), size=None)
    assert drain(fetcher) == DATA and fetcher.size == SIZE


def test_a_range_is_read_exactly_and_never_past_its_end() -> None:
    source = FakeObject(DATA, [Fault(15_000, "reset")], publish_size=True)
    fetcher = fetcher_for(source, size=30_000, start=10_000, limit=30_000)
    assert drain(fetcher) == DATA[10_000:30_000]
    assert max(end for _, end in source.opens) <= 30_000


def test_a_range_past_the_object_end_stops_at_the_end() -> None:
    fetcher = fetcher_for(FakeObject(DATA, publish_size=True), size=80_000, limit=80_000)
    assert drain(fetcher) == DATA and fetcher.size == SIZE
    beyond = fetcher_for(FakeObject(DATA, publish_size=True), size=None, start=60_000)
    assert beyond.next_extent() is None


def test_seek_restarts_at_the_target_and_clamps_to_the_size() -> None:
    source = FakeObject(DATA)
    fetcher = fetcher_for(source)
    assert fetcher.next_extent() == DATA[:EXTENT]
    fetcher.seek(25_000)
    assert source.open_bodies == 0, "the open response was dropped"
    assert drain(fetcher) == DATA[25_000:]
    assert source.opens[1] == (25_000, 25_000 + 1500), "a seek starts with the first span again"
    fetcher.seek(10**9)
    assert fetcher.next_extent() is None


def test_close_stops_fetching_and_releases_the_response() -> None:
    source = FakeObject(DATA)
    fetcher = fetcher_for(source)
    assert fetcher.next_extent() == DATA[:EXTENT]
    fetcher.close()
    assert source.open_bodies == 0 and fetcher.next_extent() is None
    assert len(source.opens) == 1


@pytest.mark.parametrize("read_ahead", [False, True], ids=["direct", "read-ahead"])
def test_stream_reads_exact_bytes_whatever_the_read_sizes(read_ahead: bool) -> None:
    faults = [Fault(1_001, "reset"), Fault(8_000, "cut"), Fault(31_415, "stall")]
    sizes = [1, 7, 999, 1000, 1001, 4096, 0, 3]
    position = 0
    with stream_over(FakeObject(DATA, faults), read_ahead) as stream:
        for step in range(10_000):
            if position >= SIZE:
                break
            size = sizes[step % len(sizes)]
            assert stream.read(size) == DATA[position : position + size]
            position = min(SIZE, position + size)
            assert stream.tell() == position
        buffer = bytearray(10)
        assert stream.read() == b"" and stream.read(10) == b"" and stream.readinto(buffer) == 0
        assert stream.tell() == SIZE


@pytest.mark.parametrize("read_ahead", [False, True], ids=["direct", "read-ahead"])
def test_readinto_fills_buffers_exactly(read_ahead: bool) -> None:
    received = bytearray()
    with stream_over(FakeObject(DATA, [Fault(4_321, "reset")]), read_ahead) as stream:
        buffer = bytearray(3_333)
        while count := stream.readinto(buffer):
            received += buffer[:count]
    assert bytes(received) == DATA


@pytest.mark.parametrize("read_ahead", [False, True], ids=["direct", "read-ahead"])
def test_seek_and_tell(read_ahead: bool) -> None:
    size = 3 * 2**20  # longer than the read-on distance, so a far jump makes a new request
    data = random_bytes(size, seed=1)
    source = FakeObject(data)
    with stream_over(source, read_ahead, size, extent_bytes=2**16, max_span_bytes=2**18) as stream:
        assert stream.seekable() and stream.read(100) == data[:100]
        assert stream.seek(50, io.SEEK_CUR) == 150 and stream.tell() == 150
        assert stream.read(10) == data[150:160]
        assert 150 not in [offset for offset, _ in source.opens], "a short hop reads on"
        assert stream.seek(2_500_000) == 2_500_000 and stream.read(10) == data[2_500_000:2_500_010]
        assert source.opens[-1][0] == 2_500_000, "a far jump asks for the target exactly"
        assert stream.seek(-100, io.SEEK_END) == size - 100 and stream.read() == data[-100:]
        assert stream.seek(10) == 10 and stream.read(5) == data[10:15], "backwards after EOF"
        assert source.opens[-1][0] == 10
        assert stream.seek(size + 1000) == size and stream.read() == b""
        with pytest.raises(ValueError, match="negative"):
            stream.seek(-1)
    with pytest.raises(ValueError, match="closed"):
        stream.read(1)
    with pytest.raises(ValueError, match="closed"):
        stream.seek(0)
    assert source.open_bodies == 0


@pytest.mark.parametrize("read_ahead", [False, True], ids=["direct", "read-ahead"])
def test_a_stream_opened_with_head_bytes_resumes_after_them(read_ahead: bool) -> None:
    # What open_remote does on S3: the first GET's bytes are the head, the fetcher goes on.
    start, head = 12_000, DATA[12_000:12_500]
    source = FakeObject(DATA, [Fault(12_500, "reset"), Fault(20_000, "cut")])
    with stream_over(source, read_ahead, start=start, head=head) as stream:
        assert stream.tell() == start
        assert stream.read() == DATA[start:] and stream.tell() == SIZE
    assert source.opens[0][0] == 12_500 and len(source.fired) == 2


@pytest.mark.parametrize("read_ahead", [False, True], ids=["direct", "read-ahead"])
def test_tarfile_reads_every_member_through_faults(read_ahead: bool) -> None:
    members = {f"{index:04d}.bin": random_bytes(3_000 + 1_700 * index, index) for index in range(6)}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    blob = buffer.getvalue()
    faults = [
        Fault(offset, kind) for offset, kind in [(100, "reset"), (512, "cut"), (9_000, "stall")]
    ]
    read: dict[str, bytes] = {}
    stream = stream_over(FakeObject(blob, faults), read_ahead, len(blob))
    with stream, tarfile.open(fileobj=stream, mode="r|") as archive:
        for info in archive:
            extracted = archive.extractfile(info)
            assert extracted is not None
            read[info.name] = extracted.read()
    assert read == members


@pytest.mark.parametrize("read_ahead", [False, True], ids=["direct", "read-ahead"])
def test_an_exhausted_budget_reaches_the_reader(read_ahead: bool) -> None:
    source = FakeObject(DATA, [Fault(20_000, "reset", times=100)])
    with stream_over(source, read_ahead, max_attempts=2) as stream:
        assert stream.read(20_000) == DATA[:20_000]
        with pytest.raises(StorageError, match="byte offset 20000"):
            stream.read(1)
        extents = stream.extent_source
    assert not getattr(extents, "alive", False)
    assert source.open_bodies == 0


def _read_in_child(stream: RemoteStream) -> None:
    with pytest.raises(StorageError, match="opened in process"):
        stream.read(3 * EXTENT)  # more than the parent left buffered, so a fetch is needed


def test_a_stream_is_not_read_in_a_forked_child() -> None:
    with stream_over(FakeObject(DATA), read_ahead=False) as stream:
        assert stream.read(10) == DATA[:10]
        child = multiprocessing.get_context("fork").Process(target=_read_in_child, args=(stream,))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork with threads
            child.start()
        child.join(timeout=60)
        assert child.exitcode == 0
        assert stream.read(10) == DATA[10:20], "the parent reads on"


def test_bounded_file_stops_at_its_end() -> None:
    with BoundedFile(io.BytesIO(DATA), 300) as bounded:
        assert bounded.seekable() and bounded.seek(100) == 100
        assert bounded.read(50) == DATA[100:150]
        assert bounded.read() == DATA[150:300] and bounded.tell() == 300
        assert bounded.read() == b"" and bounded.read(10) == b""
        bounded.seek(250)
        assert bounded.read(None) == DATA[250:300]
        bounded.seek(400)
        assert bounded.read() == b"" and bounded.read(5) == b""
        inner = bounded._stream
    assert inner.closed, "closing the BoundedFile closes the file under it"


def test_bounded_file_over_a_real_file_in_small_reads(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "shard.tar"
    path.write_bytes(DATA)
    with open(path, "rb") as file:
        file.seek(1_000)
        bounded = BoundedFile(file, 4_321)
        pieces = []
        while piece := bounded.read(7):
            pieces.append(piece)
        assert b"".join(pieces) == DATA[1_000:4_321]
