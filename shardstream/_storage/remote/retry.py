"""Which storage errors are worth retrying, how long to wait, and the error raised at the end.

Object stores fail transiently all the time (connection resets, ``503 SlowDown``, stalls,
bodies cut short); those are retried with exponential backoff and jitter. Errors that another
try cannot fix (missing object, access denied, bad credentials, bugs) fail at once. botocore's
exceptions are not all ``OSError``, so they are classified here by type and error code.
"""

from __future__ import annotations

import asyncio
import logging
import random
import sys
import threading
from collections.abc import Sequence

from shardstream._storage.background import ProcessLocal
from shardstream._storage.messages import redact_error, redact_text
from shardstream._storage.options import ReadOptions
from shardstream.errors import StorageError

__all__ = [
    "Retrier",
    "ShortReadError",
    "StatusError",
    "client_error_code",
    "fatal_error",
    "is_retryable",
    "retries_in_process",
]

_RETRIES = [0]  # failed tries retried by this process (loader statistics read it)


def retries_in_process() -> int:
    """Failed storage tries this process has retried so far (all stores, all threads)."""
    return _RETRIES[0]


logger = logging.getLogger("shardstream.storage")


def _retryable_boto_errors() -> tuple[type[BaseException], ...]:
    """botocore errors (not OSError) that a new connection may fix; ResponseParserError
    covers the invalid XML some stores send while throttling.

    botocore and aiohttp are looked up among the imported modules, never imported here: an
    exception of theirs exists only once they are, and importing them cost every reader
    (local ones included) about 0.15 s at start-up.
    """
    errors = sys.modules.get("botocore.exceptions")
    if errors is None:
        return ()
    found = [errors.ConnectionError, errors.HTTPClientError, errors.IncompleteReadError,
             errors.ResponseStreamingError]  # fmt: skip
    parsers = sys.modules.get("botocore.parsers")
    if parsers is not None:
        found.append(parsers.ResponseParserError)
    return tuple(found)


#: S3 error codes (and HTTP statuses) that mean "try again later".
_RETRYABLE_CODES = frozenset(
    {
        "500", "502", "503", "504", "429",
        "InternalError", "ServiceUnavailable", "SlowDown", "RequestTimeout", "Throttling",
        "ThrottlingException", "RequestLimitExceeded", "TooManyRequests",
        "RequestTimeTooSkewed", "BadGateway", "GatewayTimeout", "OperationAborted",
    }
)  # fmt: skip
_NOT_FOUND_CODES = frozenset({"404", "NoSuchKey", "NoSuchBucket", "NotFound"})
_DENIED_CODES = frozenset(
    {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"}
)
_CHANGED_CODES = frozenset({"412", "PreconditionFailed"})
_FATAL_OS_ERRORS = (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)


class ShortReadError(OSError):
    """A response body ended before the bytes its headers promised (retryable)."""


class StatusError(OSError):
    """An HTTP answer that is not what was asked for (backends without botocore raise it).

    Classified by its status like S3's errors: 5xx, 429 and 408 are retried, 404 is a missing
    object, 401 and 403 a denial, 412 an object changed while read, anything else fatal.

    Args:
        status: The HTTP status.
        code: The store's error code, if it sent one.
        message: What the store said (or what was wrong with the answer).
    """

    def __init__(self, status: int, code: str = "", message: str = "") -> None:
        super().__init__(f"HTTP {status}{' ' + code if code else ''}: {message}".rstrip(": "))
        self.status, self.code = status, code


def client_error_code(exc: BaseException) -> tuple[str, int]:
    """``(error code, HTTP status)`` of a botocore ``ClientError`` or a :class:`StatusError`."""
    if isinstance(exc, StatusError):
        return exc.code or str(exc.status), exc.status
    response = getattr(exc, "response", None) or {}
    code = str(response.get("Error", {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code, status


def _is_client_error(exc: BaseException) -> bool:
    if isinstance(exc, StatusError):
        return True
    errors = sys.modules.get("botocore.exceptions")
    return errors is not None and isinstance(exc, errors.ClientError)


def is_retryable(exc: BaseException) -> bool:
    """True when another try of the same request may succeed."""
    if _is_client_error(exc):
        code, status = client_error_code(exc)
        return code in _RETRYABLE_CODES or status >= 500 or status in (408, 429)
    if isinstance(exc, _FATAL_OS_ERRORS):
        return False
    if isinstance(exc, (OSError, asyncio.TimeoutError, TimeoutError)):
        return True  # ConnectionResetError, socket timeouts, s3fs-translated server errors...
    if isinstance(exc, _retryable_boto_errors()):
        return True
    aiohttp = sys.modules.get("aiohttp")
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        status = getattr(exc, "status", 500)
        return not isinstance(exc, aiohttp.ClientResponseError) or status >= 500 or status == 429
    return False


def _describe(exc: BaseException, secrets: Sequence[str]) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return redact_text(text, secrets)[:500]


def fatal_error(
    exc: BaseException, url: str, action: str, secrets: Sequence[str] = ()
) -> BaseException:
    """The exception to raise for a non-retryable ``exc`` (the URL named, no credentials)."""
    code, status = client_error_code(exc) if _is_client_error(exc) else ("", 0)
    cause = _describe(exc, secrets)
    if isinstance(exc, FileNotFoundError) or code in _NOT_FOUND_CODES or status == 404:
        return FileNotFoundError(
            f"{url}: {action} failed: the object does not exist ({cause}). "
            "Check the bucket, prefix and name."
        )
    if isinstance(exc, PermissionError) or code in _DENIED_CODES or status in (401, 403):
        return PermissionError(
            f"{url}: {action} failed: access denied ({cause}). Check the credentials "
            "(environment, AWS config or storage_options) and the bucket policy."
        )
    if code in _CHANGED_CODES or status == 412:
        return StorageError(
            f"{url}: {action} failed: the object changed while it was being read ({cause}). "
            "Shards must not be rewritten while they are read; restart the epoch."
        )
    return StorageError(f"{url}: {action} failed with a non-retryable error: {cause}")


#: The retry jitter's own generator (never the user's ``random`` stream, which seeded
#: augmentations draw from), one per process so forked workers draw apart. One per request
#: cost a ``urandom`` read, a GIL release, on every GET.
_JITTER: ProcessLocal[random.Random] = ProcessLocal(random.Random)


class Retrier:
    """Counts failed tries of one request and sleeps between them.

    The count restarts whenever a try makes progress (``succeeded()``), so a long shard read
    survives any number of spread-out faults, while ``max_attempts`` failures in a row give
    up with a :class:`StorageError`.

    Args:
        url: The object, as shown in messages (already redacted).
        action: What is being done, e.g. ``"reading"``, for messages.
        max_attempts: Tries in a row, the first included.
        backoff_s: First delay; doubles per failure up to ``max_backoff_s``; jittered.
        max_backoff_s: Longest delay.
        secrets: Literal strings to scrub from messages.
        stop: When set, sleeping stops early (the stream was closed).
    """

    def __init__(
        self,
        url: str,
        action: str,
        max_attempts: int,
        backoff_s: float,
        max_backoff_s: float,
        secrets: Sequence[str] = (),
        stop: threading.Event | None = None,
    ) -> None:
        self.url, self.action, self.secrets = url, action, secrets
        self.max_attempts = max(1, int(max_attempts))
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.stop = stop or threading.Event()
        self.failures = 0
        self.total_failures = 0

    @classmethod
    def for_options(
        cls,
        url: str,
        action: str,
        options: ReadOptions,
        secrets: Sequence[str] = (),
        stop: threading.Event | None = None,
    ) -> Retrier:
        """A retrier with the tries and delays of ``options``."""
        return cls(
            url, action, options.max_attempts, options.backoff_s, options.max_backoff_s,
            secrets, stop,
        )  # fmt: skip

    def fresh(self) -> Retrier:
        """A retrier like this one with no failures counted (for one request among several
        of the same read, stopped together)."""
        return Retrier(
            self.url, self.action, self.max_attempts, self.backoff_s, self.max_backoff_s,
            self.secrets, self.stop,
        )  # fmt: skip

    def succeeded(self) -> None:
        """Record progress: the next failure starts a fresh series of tries."""
        self.failures = 0

    def failed(self, exc: BaseException, offset: int, total: int | None = None) -> None:
        """Record a failed try; sleep before the next one, or raise if it is pointless."""
        where = f"at byte offset {offset}" + (f" of {total}" if total is not None else "")
        redact_error(exc, self.secrets)  # it becomes the raised error's cause
        if not is_retryable(exc):
            raise fatal_error(exc, self.url, f"{self.action} {where}", self.secrets) from exc
        self.failures += 1
        self.total_failures += 1
        _RETRIES[0] += 1
        cause = _describe(exc, self.secrets)
        if self.failures >= self.max_attempts:
            raise StorageError(
                f"{self.url}: {self.action} failed {where} after {self.failures} attempts in a "
                f"row; last error: {cause}. Check the endpoint and the network, or raise "
                "ReadOptions.max_attempts / timeout_s."
            ) from exc
        delay = min(self.max_backoff_s, self.backoff_s * 2 ** min(self.failures - 1, 62))
        delay *= 0.5 + 0.5 * _JITTER.get().random()  # jitter: workers must not retry in step
        logger.warning(
            "%s: %s %s failed (attempt %d of %d, retrying in %.2fs): %s",
            self.url, self.action, where, self.failures, self.max_attempts, delay, cause,
        )  # fmt: skip
        self.stop.wait(delay)
