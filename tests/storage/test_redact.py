"""The one place secrets are masked: text, exceptions with their causes, log records."""

from __future__ import annotations

import logging
import pickle
import traceback

import pytest

from shardstream._storage import Store
from shardstream._storage.messages import (
    redact_error,
    redact_text,
    redact_url,
    remember_secrets,
    secret_values,
    url_secrets,
)
from shardstream.errors import ConfigError, StorageError


class _TextElsewhere(Exception):
    """A client error whose ``__str__`` reads an attribute set after ``__init__``."""

    def __str__(self) -> str:
        return f"failed at {self.where}"


def test_secrets_are_found_in_every_form_options_take() -> None:
    options = {
        "endpoint_url": "http://user:endpoint-pw@127.0.0.1:9000",
        "sas_token": "sv=2021&sig=sas-signature",
        "connection_string": "AccountName=acct;AccountKey=account-key==;BlobEndpoint=http://h",
        "client_kwargs": {"aws_session_token": "session-token"},
        "anon": False,
        "token": "anon",  # gcsfs's way to say "no credentials", not a secret
    }
    found = secret_values(options)
    for secret in ("endpoint-pw", "sas-signature", "account-key==", "account-key%3D%3D",
                   "session-token"):  # fmt: skip
        assert secret in found
    assert "acct" not in found and "anon" not in found and "127.0.0.1" not in " ".join(found)
    assert url_secrets("https://reader:pw-1234@host/x") == ["reader:pw-1234", "pw-1234"]


def test_an_exception_chain_is_redacted_in_place() -> None:
    secret = "-".join(["chain", "secret", "1"])  # not in a source line a traceback quotes
    remember_secrets([secret])
    try:
        try:
            error = _TextElsewhere("x")
            error.where = f"http://u:{secret}@host/bucket"  # type: ignore[attr-defined]
            raise error
        except _TextElsewhere as cause:
            error = OSError(2, f"missing {secret}", f"/tmp/{secret}")
            error.add_note(f"while reading with {secret}")
            raise error from cause
    except OSError as raised:
        outer = raised
    redact_error(outer)
    text = "".join(traceback.format_exception(outer))
    assert secret not in text and "missing ***: '/tmp/***'" in text and "with ***" in text
    assert isinstance(outer.__cause__, _TextElsewhere)  # its type is kept
    assert secret not in repr(outer.__cause__) and "failed at http://***@host" in text
    assert secret not in str(pickle.loads(pickle.dumps(outer.__cause__)))


def test_log_records_are_redacted_as_they_are_made(caplog: pytest.LogCaptureFixture) -> None:
    remember_secrets(["record-secret-2"])
    logging.getLogger("someclient").warning("retrying with %s", "key record-secret-2")
    assert "record-secret-2" not in caplog.text and "key ***" in caplog.text


def test_object_store_urls_with_credentials_are_refused_without_echo() -> None:
    for url in ("s3://AKIA:url-secret-3@bucket/x", "gs://u:url-secret-3@bucket/x",
                "az://u:url-secret-3@container/x"):  # fmt: skip
        with pytest.raises(ConfigError, match="cannot carry credentials") as raised:
            Store(url).exists("x")  # refused before any request
        assert "url-secret-3" not in str(raised.value)
    assert redact_text("GET s3://bucket/url-secret-3") == "GET s3://bucket/***"


def test_a_store_redacts_what_its_methods_raise() -> None:
    secret = "-".join(["method", "secret", "4"])
    store = Store("memory://redact-test", {"token": secret})
    with pytest.raises((FileNotFoundError, StorageError)) as raised:
        store.read_bytes(f"{secret}/missing")
    text = "".join(traceback.format_exception(raised.value))
    assert secret not in text and "***/missing" in text


def test_options_objects_show_no_secret_in_their_repr() -> None:
    from shardstream import Stream, StreamOptions

    secret = "-".join(["repr", "secret", "5"])
    options = {"endpoint_url": "http://127.0.0.1:9000", "secret": secret}
    stream = Stream(f"https://u:{secret}@host/ds", storage_options=options)
    for shown in (repr(StreamOptions(storage_options=options)), repr(stream)):
        assert secret not in shown and "'secret': '***'" in shown
        assert "endpoint_url': 'http://127.0.0.1:9000'" in shown


def test_an_azure_container_before_the_at_is_no_secret() -> None:
    """``az://data@account...`` names the container "data": taking it for a secret masked the
    word in every later message of the process ("***set state restored")."""
    url = "az://data@account.blob.core.windows.net/ds"
    assert url_secrets(url) == []
    assert redact_url(url) == url
    Store(url)  # remembers what it holds as secrets
    assert redact_text("the dataset state was restored") == "the dataset state was restored"
    assert url_secrets("az://user:hunter22@account/ds") == ["user:hunter22", "hunter22"]
    assert redact_url("https://token1234@host/x") == "https://***@host/x"
