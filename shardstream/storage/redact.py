"""Keep credentials out of every message shardstream writes (errors, logs, progress, manifests).

Storage URLs and ``storage_options`` can carry secrets: ``s3://KEY:SECRET@bucket/...``,
presigned query strings (``X-Amz-Signature=...``), or ``{"key": ..., "secret": ...,
"token": ...}`` options. Anything that formats a URL, an option mapping or the text of a
storage exception into a message passes it through :func:`redact_text` (or the helpers below)
first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["REDACTED", "redact_options", "redact_text", "redact_url", "secret_values"]

REDACTED = "***"

#: Option names (any nesting level, case-insensitive, substring match) whose values are secret.
_SECRET_NAME = re.compile(
    r"(key|secret|token|password|passwd|credential|signature|sas|auth|session"
    r"|connection_string)",
    re.IGNORECASE,
)
#: Option names that contain a secret-looking word but are safe and useful in messages.
_SAFE_NAMES = frozenset({"endpoint_url", "region_name", "anon", "use_ssl", "requester_pays"})
#: ``scheme://user:password@host`` -> ``scheme://***@host``.
_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.\-]*://)[^/@\s]+@")
#: Query parameters of presigned URLs and SAS tokens.
_QUERY_SECRET = re.compile(
    r"(?<=[?&])(?P<name>(?:x-amz-(?:signature|credential|security-token)|signature|sig|awsaccesskeyid"
    r"|token|access_token|password|secret|key|se|sp|sv|skoid|sktid)=)[^&\s\"'<>]+",
    re.IGNORECASE,
)
#: Shortest option value treated as a secret when scrubbing free text (avoids masking "1").
_MIN_SECRET_CHARS = 4


def _is_secret_name(name: str) -> bool:
    return name.lower() not in _SAFE_NAMES and bool(_SECRET_NAME.search(name))


def secret_values(options: Mapping[str, Any] | None) -> list[str]:
    """Every string value stored under a secret-looking name in ``options`` (nested too)."""
    found: list[str] = []

    def visit(value: Any, secret: bool) -> None:
        if isinstance(value, Mapping):
            for name, item in value.items():
                visit(item, secret or _is_secret_name(str(name)))
        elif isinstance(value, (list, tuple)):
            for item in value:
                visit(item, secret)
        elif secret and isinstance(value, str) and len(value) >= _MIN_SECRET_CHARS:
            found.append(value)

    visit(options or {}, False)
    # Longest first, so a secret that contains another one is masked whole.
    return sorted(set(found), key=len, reverse=True)


def redact_url(url: str) -> str:
    """``url`` without userinfo (``user:pass@``) or signature-like query parameters."""
    text = _USERINFO.sub(lambda m: m.group("scheme") + REDACTED + "@", str(url))
    return _QUERY_SECRET.sub(lambda m: m.group("name") + REDACTED, text)


def redact_text(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with URL secrets and each of the literal ``secrets`` replaced by ``***``."""
    cleaned = redact_url(str(text))
    for secret in secrets:
        if secret:
            cleaned = cleaned.replace(secret, REDACTED)
    return cleaned


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
