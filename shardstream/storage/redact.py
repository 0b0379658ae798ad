"""Keep credentials out of every message shardstream writes (errors, logs, progress, manifests).

Storage URLs and ``storage_options`` can carry secrets: ``https://user:password@host/...``,
presigned query strings (``X-Amz-Signature=...``), a password in an ``endpoint_url``, or
``{"key": ..., "secret": ..., "token": ...}`` options; the environment may hold more
(``AWS_SECRET_ACCESS_KEY``...). This module is the one place that knows them: every store
remembers its secrets here when it is made (:func:`remember_secrets`, in each process that
makes or unpickles one), and :func:`redact_text` masks every secret the process knows, as
well as URL user info and signatures, in any text. Exceptions (a client's own, chained into
shardstream's) and log records are redacted with it in :mod:`.redacterrors`.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = [
    "REDACTED",
    "environment_secrets",
    "known_secrets",
    "redact_options",
    "redact_text",
    "redact_url",
    "redacted_repr",
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
