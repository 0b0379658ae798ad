"""Exceptions and log records without secrets: a client's error text included.

A client's own exception (botocore, aiohttp, gcsfs, adlfs) may quote a secret the user gave
shardstream: a bucket name made of ``KEY:SECRET@bucket``, an endpoint URL with its password,
a SAS token in a request URL. :func:`redact_error` masks what :mod:`.redact` knows in an
exception and every exception chained to it, in place, so that its ``str``, ``repr`` and
formatted traceback (and a DataLoader worker's, formatted before it crosses processes) carry
none. :func:`redacting_methods` applies it to what a class's methods raise (the
:class:`~shardstream.storage.Store`); log records, shardstream's and its clients', are
redacted as they are made, once the process knows a secret.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from shardstream.storage.redact import known_secrets, redact_text

__all__ = ["RedactedError", "redact_error", "redacting_errors", "redacting_methods"]


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
    :class:`~shardstream.storage.Store` raises, a client's own errors chained in, carries no
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
