"""One backend per kind of store, and the one switch that picks it from a URL's protocol.

A backend is a small object (:class:`~shardstream._storage.backends.generic.Backend`) that
knows how its store answers the few questions the rest of shardstream asks through
:class:`~shardstream._storage.Store`: stat, ranged reads (alone or many at once, announced
ahead), listing, exclusive create and atomic publish. Nothing outside this package asks which
store it is on; a new store is one file here, one entry in :data:`_BACKENDS`, and one test
fixture (see docs/architecture.md, "Adding a store").
"""

from __future__ import annotations

import importlib
import os

from shardstream._storage.backends.generic import Backend
from shardstream._storage.messages import redact_url
from shardstream.errors import ConfigError

__all__ = ["Backend", "backend_for", "protocol_of"]

#: protocol -> (module, class) of its backend; anything else is the generic fsspec backend.
_BACKENDS: dict[str, tuple[str, str]] = {
    "file": ("local", "LocalBackend"),
    "local": ("local", "LocalBackend"),
    "s3": ("s3", "S3Backend"),
    "s3a": ("s3", "S3Backend"),
    "http": ("http", "HttpBackend"),
    "https": ("http", "HttpBackend"),
    "gs": ("gcs", "GcsBackend"),
    "gcs": ("gcs", "GcsBackend"),
    "az": ("azure", "AzureBackend"),
    "abfs": ("azure", "AzureBackend"),
    "abfss": ("azure", "AzureBackend"),
}

_made: dict[str, Backend] = {}


def protocol_of(url: str | os.PathLike[str]) -> str:
    """The protocol of ``url`` in lower case: ``"file"`` for plain paths."""
    text = os.fspath(url)
    return text.split("://", 1)[0].lower() if "://" in text else "file"


def backend_for(url: str | os.PathLike[str]) -> Backend:
    """The backend of ``url``'s store (made once per process and protocol).

    Examples:
        >>> backend_for("s3://bucket/train").name
        's3'
        >>> backend_for("/data/train").name
        'local'
    """
    protocol = protocol_of(url)
    backend = _made.get(protocol)
    if backend is None:
        module, name = _BACKENDS.get(protocol, ("generic", "Backend"))
        found = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        backend = _made[protocol] = found()
    if backend.credentials and "@" in str(url):
        _refuse_credentials(os.fspath(url), backend)
    return backend


def _refuse_credentials(url: str, backend: Backend) -> None:
    """Refuse ``scheme://KEY:SECRET@bucket/...`` on an object store, whose client would take
    the credentials for a bucket name (and quote them in its errors), without echoing them.

    Azure's ``az://container@account.blob.core.windows.net/...`` (no password) stays valid.
    """
    info = url.split("://", 1)[-1].split("/", 1)[0].rpartition("@")[0]
    if not info or (backend.name == "azure" and ":" not in info):
        return
    raise ConfigError(
        f"{redact_url(url)}: {backend.name} URLs cannot carry credentials (the part before "
        f"'@' is not shown, and was not used); give them as {backend.credentials}"
    )
