"""The Retrier on its own: which errors are retried, how long it waits, what it raises at the end.

No server: the exceptions are the real types that botocore, aiohttp and the OS raise, built here.
The sleeps are observed through a ``stop`` event that records the delay it is asked to wait.
"""

from __future__ import annotations

import logging
import threading
import time

import aiohttp
import pytest
import yarl
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)
from botocore.parsers import ResponseParserError
from multidict import CIMultiDict, CIMultiDictProxy

from shardstream._storage.remote.retry import (
    Retrier,
    ShortReadError,
    client_error_code,
    fatal_error,
    is_retryable,
)
from shardstream.errors import ConfigError, StorageError

URL = "s3://bucket/train/shard-000007.tar"
SECRET = "wJalrXUtnFEMI-K7MDENG-bPxRfiCYSECRET"
ENDPOINT = "https://s3.example.test"


def client_error(code: str, status: int, operation: str = "GetObject") -> ClientError:
    """A real botocore ClientError, as its parser builds it from an S3 error response."""
    response = {
        "Error": {"Code": code, "Message": f"{code} from the server"},
        "ResponseMetadata": {"HTTPStatusCode": status},
    }
    return ClientError(response, operation)


def response_error(status: int, url: str = f"{ENDPOINT}/bucket/key") -> aiohttp.ClientResponseError:
    info = aiohttp.RequestInfo(yarl.URL(url), "GET", CIMultiDictProxy(CIMultiDict()), yarl.URL(url))
    return aiohttp.ClientResponseError(info, (), status=status, message="server said no")


class RecordingStop(threading.Event):
    """A stop event that records each requested delay instead of sleeping it."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.delays.append(float(timeout or 0.0))
        return self.is_set()


def recording_retrier(max_attempts: int = 4, backoff_s: float = 1.0, cap_s: float = 4.0) -> Retrier:
    return Retrier(URL, "reading", max_attempts, backoff_s, cap_s, [SECRET], RecordingStop())


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionResetError(104, "Connection reset by peer"),
        TimeoutError("read stalled"),
        ShortReadError("body ended at byte 10"),
        BrokenPipeError(32, "Broken pipe"),
        client_error("SlowDown", 503),
        client_error("ServiceUnavailable", 503),
        client_error("InternalError", 500),
        client_error("RequestTimeout", 400),  # retryable by code although the status is 4xx
        client_error("", 502),  # retryable by status alone
        client_error("TooManyRequests", 429),
        EndpointConnectionError(endpoint_url=ENDPOINT),
        ConnectionClosedError(endpoint_url=ENDPOINT),
        ReadTimeoutError(endpoint_url=ENDPOINT),
        IncompleteReadError(actual_bytes=10, expected_bytes=20),
        ResponseStreamingError(error="connection lost"),
        ResponseParserError("invalid XML while throttled"),
        aiohttp.ServerDisconnectedError(),
        response_error(503),
        response_error(429),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_transient_errors_are_retryable(exc: BaseException) -> None:
    assert is_retryable(exc)


@pytest.mark.parametrize(
    "exc",
    [
        FileNotFoundError(2, "No such file or directory"),
        PermissionError(13, "Permission denied"),
        IsADirectoryError(21, "Is a directory"),
        client_error("NoSuchKey", 404),
        client_error("AccessDenied", 403),
        client_error("InvalidAccessKeyId", 403),
        client_error("PreconditionFailed", 412),
        client_error("InvalidRange", 416),
        NoCredentialsError(),
        response_error(404),
        ValueError("a bug, not the network"),
        ConfigError("bad option"),
        KeyError("missing"),
    ],
    ids=lambda exc: type(exc).__name__,
)
def test_permanent_errors_are_not_retryable(exc: BaseException) -> None:
    assert not is_retryable(exc)


def test_client_error_code_reads_code_and_status() -> None:
    assert client_error_code(client_error("SlowDown", 503)) == ("SlowDown", 503)
    assert client_error_code(ValueError("no response")) == ("", 0)


@pytest.mark.parametrize(
    ("exc", "expected_type", "words"),
    [
        (FileNotFoundError(2, "gone"), FileNotFoundError, "does not exist"),
        (client_error("NoSuchKey", 404), FileNotFoundError, "does not exist"),
        (PermissionError(13, "denied"), PermissionError, "access denied"),
        (client_error("AccessDenied", 403), PermissionError, "access denied"),
        (client_error("PreconditionFailed", 412), StorageError, "changed while it was being read"),
        (ValueError("unexpected"), StorageError, "non-retryable"),
    ],
    ids=["FileNotFoundError", "NoSuchKey", "PermissionError", "AccessDenied", "412", "ValueError"],
)
def test_fatal_errors_raise_at_once_with_a_clear_type(
    exc: BaseException, expected_type: type[BaseException], words: str
) -> None:
    retrier = recording_retrier()
    with pytest.raises(expected_type) as caught:
        retrier.failed(exc, offset=4096, total=10_000)
    message = str(caught.value)
    assert URL in message and words in message and "byte offset 4096 of 10000" in message
    assert caught.value.__cause__ is exc
    assert retrier.failures == 0 and retrier.total_failures == 0
    assert retrier.stop.delays == [], "a fatal error must not wait"  # type: ignore[attr-defined]


def test_fatal_error_maps_without_a_retrier() -> None:
    error = fatal_error(client_error("NoSuchBucket", 404), URL, "opening")
    assert isinstance(error, FileNotFoundError) and "opening failed" in str(error)


def test_attempts_are_bounded_then_storage_error_names_object_and_offset() -> None:
    retrier = recording_retrier(max_attempts=4)
    for attempt in range(1, 4):
        retrier.failed(client_error("SlowDown", 503), offset=1234, total=5000)
        assert retrier.failures == attempt
    with pytest.raises(StorageError) as caught:
        retrier.failed(client_error("SlowDown", 503), offset=1234, total=5000)
    message = str(caught.value)
    assert URL in message and "4 attempts" in message and "SlowDown" in message
    assert "byte offset 1234 of 5000" in message
    assert isinstance(caught.value, OSError)
    assert len(retrier.stop.delays) == 3, "no sleep after the last attempt"  # type: ignore[attr-defined]


def test_max_attempts_below_one_still_tries_once() -> None:
    retrier = recording_retrier(max_attempts=0)
    with pytest.raises(StorageError, match="1 attempts"):
        retrier.failed(ConnectionResetError("reset"), offset=0)


def test_progress_restarts_the_count_of_failures_in_a_row() -> None:
    retrier = recording_retrier(max_attempts=3)
    for offset in range(0, 10_000, 1000):  # ten spread-out faults, two in a row at most
        retrier.failed(ConnectionResetError("reset"), offset)
        retrier.failed(TimeoutError("stall"), offset)
        retrier.succeeded()
    assert retrier.total_failures == 20 and retrier.failures == 0
    retrier.failed(ConnectionResetError("reset"), 10_000)
    retrier.failed(ConnectionResetError("reset"), 10_000)
    with pytest.raises(StorageError):
        retrier.failed(ConnectionResetError("reset"), 10_000)


def test_backoff_doubles_with_jitter_and_is_capped() -> None:
    retrier = recording_retrier(max_attempts=7, backoff_s=1.0, cap_s=4.0)
    for _ in range(6):
        retrier.failed(ConnectionResetError("reset"), offset=0)
    delays = retrier.stop.delays  # type: ignore[attr-defined]
    bases = [1.0, 2.0, 4.0, 4.0, 4.0, 4.0]
    assert len(delays) == len(bases)
    for delay, base in zip(delays, bases, strict=True):
        assert 0.5 * base <= delay <= base, (delays, bases)  # jitter keeps half to all of it
    assert delays[0] < delays[2] and max(delays) <= 4.0


def test_a_long_series_of_failures_keeps_waiting_the_capped_delay(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.ERROR, logger="shardstream.storage")  # 1,100 retry warnings
    retrier = recording_retrier(max_attempts=2_000, backoff_s=0.2, cap_s=10.0)
    for _ in range(1_100):  # about three hours of an outage at the 10 s cap
        retrier.failed(ConnectionResetError("reset"), offset=0)
    assert 5.0 <= retrier.stop.delays[-1] <= 10.0  # type: ignore[attr-defined]


def test_a_fresh_series_starts_from_the_first_delay_again() -> None:
    retrier = recording_retrier(max_attempts=10, backoff_s=1.0, cap_s=64.0)
    for _ in range(5):
        retrier.failed(ConnectionResetError("reset"), offset=0)
    retrier.succeeded()
    retrier.failed(ConnectionResetError("reset"), offset=100)
    assert retrier.stop.delays[-1] <= 1.0 < retrier.stop.delays[-2]  # type: ignore[attr-defined]


def test_real_sleeps_with_tiny_backoff_finish_quickly() -> None:
    retrier = Retrier(URL, "reading", 5, backoff_s=0.001, max_backoff_s=0.004)
    started = time.monotonic()
    for _ in range(4):
        retrier.failed(ConnectionResetError("reset"), offset=0)
    assert time.monotonic() - started < 5.0  # hang guard only


def test_stop_cuts_a_long_backoff_short() -> None:
    stop = threading.Event()
    stop.set()
    retrier = Retrier(URL, "reading", 5, backoff_s=20.0, max_backoff_s=20.0, stop=stop)
    started = time.monotonic()
    retrier.failed(ConnectionResetError("reset"), offset=0)
    assert time.monotonic() - started < 5.0, "a closed stream must not sleep out its backoff"


def test_secrets_never_reach_messages_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="shardstream.storage")
    signed = f"{ENDPOINT}/bucket/key?X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature={SECRET}"
    leaky = [
        client_error("SlowDown", 503),
        response_error(503, url=signed),
        ConnectionResetError(f"reset while sending key {SECRET}"),  # the last error, reported
    ]
    retrier = recording_retrier(max_attempts=len(leaky))
    with pytest.raises(StorageError) as caught:
        for exc in leaky:
            retrier.failed(exc, offset=77)
    assert "X-Amz-Signature=***" in caplog.text, "the retry was logged, redacted"
    assert "sending key ***" in str(caught.value)
    for text in (str(caught.value), repr(caught.value), caplog.text):
        assert SECRET not in text
    with pytest.raises(PermissionError) as denied:
        recording_retrier().failed(PermissionError(f"denied for {SECRET}"), offset=0)
    assert SECRET not in str(denied.value) and URL in str(denied.value)


def _jitter_draw(_: int) -> float:
    from shardstream._storage.remote import retry

    return retry._JITTER.get().random()


def test_retry_jitter_differs_per_forked_worker_and_leaves_the_users_random_alone() -> None:
    """Forked DataLoader workers must not back off in step, and a retry must not move the
    user's seeded ``random`` stream (augmentations draw from it)."""
    import multiprocessing
    import random

    from shardstream._storage.remote import retry

    with multiprocessing.get_context("fork").Pool(2, maxtasksperchild=1) as pool:
        draws = pool.map(_jitter_draw, range(4), chunksize=1)
    assert len(set(draws)) == 4
    random.seed(5)
    expected = random.random()
    random.seed(5)
    retrier = retry.Retrier("s3://b/k", "reading", 3, 0.001, 0.002)
    retrier.stop.set()  # no real sleep
    with pytest.raises(StorageError):
        for _ in range(3):
            retrier.failed(OSError("reset"), 0)
    assert random.random() == expected


def test_a_local_reader_imports_no_object_store_client() -> None:
    """Classifying botocore's and aiohttp's errors needs them only once they are imported (an
    exception of theirs cannot exist before): a local reader starts without loading either."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from shardstream.streaming import StreamingDataset\n"
        "from shardstream._storage.remote.retry import is_retryable\n"
        "assert not is_retryable(ValueError('x'))\n"
        "print(sorted(name for name in ('aiohttp', 'botocore', 's3fs') if name in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"
