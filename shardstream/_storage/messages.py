"""Keep credentials out of every message shardstream writes (errors, logs, progress, manifests).

Storage URLs and ``storage_options`` can carry secrets: ``https://user:password@host/...``,
presigned query strings (``X-Amz-Signature=...``), a password in an ``endpoint_url``, or
``{"key": ..., "secret": ..., "token": ...}`` options; the environment may hold more
(``AWS_SECRET_ACCESS_KEY``...). This module is the one place that knows them: every store
remembers its secrets here when it is made (:func:`remember_secrets`, in each process that
makes or unpickles one), and :func:`redact_text` masks every secret the process knows, as
well as URL user info and signatures, in any text. Exceptions (a client's own, chained into
shardstream's) and log records are redacted with it in this module.

Exceptions and log records without secrets: a client's error text included.

A client's own exception (botocore, aiohttp, gcsfs, adlfs) may quote a secret the user gave
shardstream: a bucket name made of ``KEY:SECRET@bucket``, an endpoint URL with its password,
a SAS token in a request URL. :func:`redact_error` masks what this module knows in an
exception and every exception chained to it, in place, so that its ``str``, ``repr`` and
formatted traceback (and a DataLoader worker's, formatted before it crosses processes) carry
none. :func:`redacting_methods` applies it to what a class's methods raise (the
:class:`~shardstream._storage.Store`); log records, shardstream's and its clients', are
redacted as they are made, once the process knows a secret.

Storage failures told as one line: what went wrong, and the fix that fits that cause.

A failed write or listing reaches the caller as a chain of exceptions (a refused connection,
wrapped by aiohttp, wrapped by botocore, wrapped by s3fs), or as a bare ``OSError`` with an
errno. :func:`explain` walks the chain and names the cause a user can act on: a full disk, a
read-only file system, a permission, missing credentials, an endpoint that does not answer, a
missing bucket or path. Exceptions of other libraries are recognised by name, so this module
imports none of them."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import inspect
import logging
import os
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

__all__ = [
    "REDACTED",
    "RedactedError",
    "environment_secrets",
    "explain",
    "known_secrets",
    "redact_error",
    "redact_options",
    "redact_text",
    "redact_url",
    "redacted_repr",
    "redacting_errors",
    "redacting_methods",
    "remember_secrets",
    "secret_values",
    "url_secrets",
]


REDACTED = "***"

#: Option names (any nesting level, case-insensitive, substring match) whose values are secret.
_SECRET_NAME = re.compile(
    r"(key|secret|token|password|passwd|credential|signature|sas|auth|session"
    r"|connection_string|^sig$)",
    re.IGNORECASE,
)
#: Option names that contain a secret-looking word but are safe and useful in messages.
_SAFE_NAMES = frozenset({"endpoint_url", "region_name", "anon", "use_ssl", "requester_pays"})
#: ``scheme://user:password@host`` -> ``scheme://***@host``.
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)(?P<info>[^/@\s]+)@")
#: Schemes whose ``name@`` before the host is a container, not a user (Azure's).
_CONTAINER_SCHEMES = frozenset({"az", "abfs", "abfss", "adl"})
#: Query parameters of presigned URLs and SAS tokens.
_QUERY_SECRET = re.compile(
    r"(?<=[?&])(?P<name>(?:x-amz-(?:signature|credential|security-token)|signature|sig|awsaccesskeyid"
    r"|token|access_token|password|secret|key|se|sp|sv|skoid|sktid)=)[^&\s\"'<>]+",
    re.IGNORECASE,
)
#: ``Name=value`` pairs inside a connection string or a SAS token (``;`` or ``&`` between).
_PAIR = re.compile(r"(?:^|[;&?])\s*(?P<name>[A-Za-z_][\w-]*)=(?P<value>[^;&]+)")
#: Environment variables whose values are credentials the object-store clients read.
_ENVIRONMENT_SECRETS = (
    "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_CLIENT_SECRET", "AZURE_CLIENT_SECRET", "GOOGLE_OAUTH_ACCESS_TOKEN",
)  # fmt: skip
#: Shortest option value treated as a secret when scrubbing free text (avoids masking "1").
_MIN_SECRET_CHARS = 4
#: Values of secret-looking options that name a way to authenticate, not a secret (gcsfs's
#: ``token="anon"``...): masking them would mask that word in every message.
_NOT_SECRETS = frozenset({"anon", "google_default", "cache", "cloud", "browser", "true", "false",
                          "none", "null"})  # fmt: skip

#: Every secret this process was given (stores made or unpickled here, the command line).
_KNOWN: set[str] = set()
_KNOWN_ORDER: list[tuple[str, ...]] = [()]  # longest first; rebuilt when a secret is added
_LOCK = threading.Lock()


def _is_secret_name(name: str) -> bool:
    return name.lower() not in _SAFE_NAMES and bool(_SECRET_NAME.search(name))


def _variants(secret: str) -> list[str]:
    """``secret`` and the spellings a message may quote it in (URL-encoded), and the values
    of its secret-looking ``name=value`` pairs (a connection string's key, a SAS's ``sig``)."""
    found = [secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)]
    for match in _PAIR.finditer(secret):
        if _is_secret_name(match.group("name")):
            found += _variants(match.group("value").strip())
    return [value for value in found if len(value) >= _MIN_SECRET_CHARS]


def url_secrets(text: str) -> list[str]:
    """The user info and passwords in every ``scheme://user:password@`` of ``text``.

    Example:
        >>> url_secrets("https://reader:hunter22@example.com/data")
        ['reader:hunter22', 'hunter22']
    """
    found: list[str] = []
    for match in _USERINFO.finditer(str(text)):
        info = match.group("info")
        if not _is_credential(match.group("scheme"), info):
            continue
        # The password, not the user name alone (a common word would be masked everywhere).
        parts = [info, info.split(":", 1)[1]] if ":" in info else [info]
        for part in parts:
            found += [part, urllib.parse.unquote(part)]
    return list(dict.fromkeys(value for value in found if len(value) >= _MIN_SECRET_CHARS))


def secret_values(options: Mapping[str, Any] | None) -> list[str]:
    """Every secret in ``options`` (nested too): the string values stored under a
    secret-looking name, and the user info of any URL among the values (``endpoint_url``)."""
    found: list[str] = []

    def visit(value: Any, secret: bool) -> None:
        if isinstance(value, Mapping):
            for name, item in value.items():
                visit(item, secret or _is_secret_name(str(name)))
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item, secret)
        elif isinstance(value, str):
            found.extend(url_secrets(value))
            if secret and len(value) >= _MIN_SECRET_CHARS and value.lower() not in _NOT_SECRETS:
                found.extend(_variants(value))

    visit(options or {}, False)
    # Longest first, so a secret that contains another one is masked whole.
    return sorted(set(found), key=len, reverse=True)


def environment_secrets() -> list[str]:
    """The credentials the object-store clients would read from the environment."""
    found: list[str] = []
    for name in _ENVIRONMENT_SECRETS:
        value = os.environ.get(name, "")
        if len(value) >= _MIN_SECRET_CHARS:
            found.extend(_variants(value))
    return found


def remember_secrets(secrets: Iterable[str]) -> None:
    """Add ``secrets`` to those :func:`redact_text` masks in every message of this process.

    Example:
        >>> remember_secrets(["hunter22"])
        >>> redact_text("password hunter22 refused")
        'password *** refused'
    """
    new = {value for value in secrets if value and len(value) >= _MIN_SECRET_CHARS}
    new.update(environment_secrets())
    if new <= _KNOWN:
        return
    with _LOCK:
        _KNOWN.update(new)
        _KNOWN_ORDER[0] = tuple(sorted(_KNOWN, key=len, reverse=True))


def known_secrets() -> tuple[str, ...]:
    """Every secret this process was given, longest first."""
    return _KNOWN_ORDER[0]


def _is_credential(scheme: str, info: str) -> bool:
    """Whether a URL's ``info@`` is credentials: not in ``az://container@account...``, where it
    names a container (a common word such as "data" would be masked in every message)."""
    return ":" in info or scheme.lower().rstrip(":/") not in _CONTAINER_SCHEMES


def _masked_userinfo(match: re.Match[str]) -> str:
    scheme, info = match.group("scheme"), match.group("info")
    return f"{scheme}{REDACTED if _is_credential(scheme, info) else info}@"


def redact_url(url: str) -> str:
    """``url`` without userinfo (``user:pass@``) or signature-like query parameters."""
    text = _USERINFO.sub(_masked_userinfo, str(url))
    return _QUERY_SECRET.sub(lambda m: m.group("name") + REDACTED, text)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL secrets, the literal ``secrets`` and every secret this process
    knows (:func:`remember_secrets`) replaced by ``***``."""
    cleaned = str(text)
    given = tuple(secrets)
    everyone = sorted({*given, *known_secrets()}, key=len, reverse=True) if given else None
    for secret in known_secrets() if everyone is None else everyone:
        if secret and secret in cleaned:
            cleaned = cleaned.replace(secret, REDACTED)
    return redact_url(cleaned)


def redact_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``options`` that is safe to log: secret-looking values become ``***``."""

    def clean(value: Any, secret: bool) -> Any:
        if isinstance(value, Mapping):
            return {k: clean(v, secret or _is_secret_name(str(k))) for k, v in value.items()}
        if secret and value is not None:
            return REDACTED
        if isinstance(value, str):
            return redact_url(value)
        return value

    return dict(clean(dict(options or {}), False))


def redacted_repr(instance: Any) -> str:
    """A dataclass's ``repr`` as the generated one, its ``storage_options`` and any URL
    secret or known secret masked (options objects users print or log)."""
    shown = []
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        if field.name == "storage_options" and value is not None:
            value = redact_options(value)
        if field.repr:
            shown.append(f"{field.name}={value!r}")
    return redact_text(f"{type(instance).__qualname__}({', '.join(shown)})")


def redact_error(error: BaseException, secrets: Iterable[str] = ()) -> BaseException:
    """Mask secrets in ``error`` and every exception chained to it, in place; returns it.

    Its arguments, string attributes and notes are redacted as :func:`redact_text` does, so
    ``str``, ``repr`` and a formatted traceback of the chain carry no secret. An exception
    whose own ``__str__`` still shows one (it keeps the text elsewhere) is given a subclass
    of its type that shows the redacted text.

    Example:
        >>> error = redact_error(OSError("https://u:hunter22@host/x unreachable"))
        >>> str(error)
        'https://***@host/x unreachable'
    """
    extra = tuple(secrets)
    seen: list[BaseException] = []
    pending: list[BaseException | None] = [error]
    while pending:
        current = pending.pop()
        if current is None or any(current is other for other in seen):
            continue
        seen.append(current)
        _redact_one(current, extra)
        pending += [current.__cause__, current.__context__]
        grouped = getattr(current, "exceptions", None)  # an exception group (Python 3.11+)
        if isinstance(grouped, tuple):
            pending += [item for item in grouped if isinstance(item, BaseException)]
    return error


@contextlib.contextmanager
def redacting_errors(secrets: Iterable[str] = ()) -> Iterator[None]:
    """Redact (:func:`redact_error`) any exception raised in the block, then let it go on."""
    try:
        yield
    except Exception as error:
        redact_error(error, secrets)
        raise


_Class = TypeVar("_Class", bound=type)


def redacting_methods(kind: _Class) -> _Class:
    """The class ``kind`` with every exception its methods raise redacted
    (:func:`redact_error`) before the caller sees it: what a
    :class:`~shardstream._storage.Store` raises, a client's own errors chained in, carries no
    secret. (Errors raised inside a context manager's block need :func:`redacting_errors`.)"""
    for name, function in list(vars(kind).items()):
        if inspect.isfunction(function) and name not in ("__init__", "__repr__"):
            setattr(kind, name, _redacting(function))
    return kind


def _redacting(function: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as error:
            redact_error(error)
            raise

    return call


def _clean(value: Any, secrets: tuple[str, ...]) -> Any:
    if isinstance(value, str):
        return redact_text(value, secrets)
    if type(value) is tuple:  # not a named tuple: its fields are read by name
        return tuple(_clean(item, secrets) for item in value)
    if type(value) is list:
        return [_clean(item, secrets) for item in value]
    return value


def _leaks(text: str, secrets: tuple[str, ...]) -> bool:
    return redact_text(text, secrets) != text


def _redact_one(error: BaseException, secrets: tuple[str, ...]) -> None:
    with contextlib.suppress(AttributeError, TypeError):  # read-only for a few types
        error.args = _clean(error.args, secrets)
    for name, value in list(getattr(error, "__dict__", {}).items()):
        if type(value) in (str, tuple, list) and (name == "__notes__" or name[:2] != "__"):
            try:
                setattr(error, name, _clean(value, secrets))
            except (AttributeError, TypeError):
                continue
    if isinstance(error, OSError):
        for name in ("strerror", "filename", "filename2"):
            value = getattr(error, name, None)
            if isinstance(value, str):
                setattr(error, name, redact_text(value, secrets))
    try:
        text, shown = str(error), repr(error)
    except Exception:  # an exception that cannot show itself shows nothing secret either
        return
    if _leaks(text, secrets) or _leaks(shown, secrets):
        _show_redacted(error, redact_text(text, secrets), redact_text(shown, secrets))


class RedactedError(Exception):
    """What a redacted exception of a made-up subclass pickles as (its type's name and text)."""

    def __init__(self, kind: str, text: str) -> None:
        super().__init__(f"{kind}: {text}")


def _show_redacted(error: BaseException, text: str, shown: str) -> None:
    """Give ``error`` a subclass of its type whose ``str``/``repr`` are the redacted ones."""
    kind = type(error)
    masked = type(kind.__name__, (kind,), {
        "__module__": kind.__module__, "__qualname__": kind.__qualname__,
        "__str__": lambda self: text, "__repr__": lambda self: shown,
        "__reduce__": lambda self: (RedactedError, (kind.__qualname__, text)),
    })  # fmt: skip
    with contextlib.suppress(TypeError):  # a built-in type: its text comes from args
        error.__class__ = masked


def _redact_log_records() -> None:
    """Make every log record of this process (shardstream's, and its clients': botocore,
    aiohttp...) redacted as it is created, once the process knows a secret (before that, a
    record costs one check more)."""
    previous = logging.getLogRecordFactory()
    if getattr(previous, "redacts_secrets", False):
        return

    def make_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if not known_secrets():
            return record
        try:
            message = record.getMessage()
        except Exception:  # a bad format is logging's to report, at emit time
            return record
        cleaned = redact_text(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None:
            redact_error(record.exc_info[1])
        return record

    make_record.redacts_secrets = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(make_record)


_redact_log_records()


_CONNECT = {"EndpointConnectionError", "ClientConnectorError", "ConnectTimeoutError",
            "ConnectionRefusedError", "ServerDisconnectedError"}  # fmt: skip
_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "InvalidAccessKeyId",
                "SignatureDoesNotMatch", "ExpiredToken", "InvalidToken"}  # fmt: skip


def _chain(error: BaseException) -> list[BaseException]:
    """The error and every exception it was raised from or while handling, outermost first."""
    seen: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not other for other in seen):
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def _names(error: BaseException) -> set[str]:
    return {kind.__name__ for kind in type(error).__mro__}


def _status(error: BaseException) -> int | None:
    """The HTTP status of a client's error (Azure's ``status_code``, gcsfs's ``code``,
    aiohttp's ``status``), when it carries one."""
    if isinstance(error, OSError):
        return None  # its errno is no HTTP status
    for name in ("status_code", "code", "status"):
        value = getattr(error, name, None)
        if isinstance(value, int) and 100 <= value < 600:
            return value
    return None


def explain(error: BaseException, detail: bool = True) -> str | None:
    """One line for a storage failure anywhere in ``error``'s chain; None when it is not one.

    ``detail=False`` leaves out the underlying message (for an error that already shows it).

    Examples:
        >>> explain(OSError(errno.EROFS, "Read-only file system", "/data/x.tar"))
        "'/data/x.tar' is on a read-only file system: write to another folder"
    """
    chain = _chain(error)
    for cause in chain:
        names = _names(cause)
        first_line = (str(cause).strip().splitlines() or [""])[0]  # Azure's go on for lines
        text = f" ({first_line})" if detail else ""
        if names & _CREDENTIALS or "Unable to locate credentials" in str(cause):
            return (
                f"the object store refused the credentials or found none{text}: set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, a profile (--storage-option "
                "profile=NAME), or --storage-option anon=true for a public bucket"
            )
        if names & _CONNECT or isinstance(cause, ConnectionRefusedError):
            return (
                f"cannot connect to the storage endpoint{text}: check --storage-option "
                "endpoint_url=... (scheme, host and port) and that the server is running"
            )
        if _status(cause) in (401, 403):
            return (
                f"access denied{text}: check the credentials and their permissions on the "
                "bucket or container and prefix (read, write, list)"
            )
        if _status(cause) == 404:
            return f"not found{text}: check the bucket or container and the prefix"
    for cause in chain:
        if isinstance(cause, OSError) and (line := _os_error(cause)) is not None:
            return line
    return None


def _os_error(error: OSError) -> str | None:
    where = repr(error.filename) if error.filename else "the destination"
    if error.errno == errno.ENOSPC:
        return f"no space left on the device that holds {where}: free space, or write elsewhere"
    if error.errno == errno.EDQUOT:
        return f"disk quota exceeded writing {where}: free space in your quota, or write elsewhere"
    if error.errno == errno.EROFS:
        return f"{where} is on a read-only file system: write to another folder"
    if isinstance(error, PermissionError):
        if error.filename:
            return f"permission denied for {where}: check the folder's owner and permissions"
        return (
            f"access denied ({error}): check the credentials' permissions on the bucket and "
            "prefix (for example s3:GetObject, s3:PutObject, s3:ListBucket)"
        )
    if isinstance(error, FileNotFoundError):
        return f"not found: {error.filename or error}: check the path or URL (bucket and prefix)"
    if isinstance(error, TimeoutError):
        return f"the storage did not answer in time ({error}): check the network and endpoint"
    return f"{type(error).__name__}: {error}"
