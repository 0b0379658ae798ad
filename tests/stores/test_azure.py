"""Azure's reads on Azurite: signed Get Blob requests on the pooled HTTP client (account key,
SAS token), the SDK's downloads only for other credentials, versions pinned by ETag."""

from __future__ import annotations

import datetime
import pathlib
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from shardstream._storage import ReadOptions, Store
from shardstream._storage.backends.azure import AzureBackend, AzureHttpSource, AzureSource
from shardstream._storage.remote.retry import StatusError
from shardstream.streaming import StreamingDataset, StreamOptions
from tests.stores import emulators
from tests.stores.conftest import BUCKET, StoreUnderTest
from tests.streaming.shards import make_dataset

FAST = ReadOptions(max_attempts=2, backoff_s=0.01, max_backoff_s=0.05, timeout_s=5.0)


@pytest.fixture
def no_sdk_downloads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The SDK's ``download_blob`` records its calls and fails: reads must not need it."""
    from azure.storage.blob.aio import BlobClient

    calls: list[str] = []

    async def download_blob(self: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(self.blob_name)
        raise AssertionError("read through the SDK's download_blob")

    monkeypatch.setattr(BlobClient, "download_blob", download_blob)
    yield calls


def _filesystem(options: dict[str, Any]) -> Any:
    import adlfs

    return adlfs.AzureBlobFileSystem(**options, skip_instance_cache=True)


def _blob(azure_store: StoreUnderTest, tmp_path: pathlib.Path, data: bytes) -> str:
    """``data`` as ``blob.bin`` on Azurite; the URL of its folder."""
    folder = tmp_path / "one"
    folder.mkdir()
    (folder / "blob.bin").write_bytes(data)
    return azure_store.put(folder, "one")


def test_a_dataset_streams_with_an_account_key_without_the_sdk(
    azure_store: StoreUnderTest, tmp_path: pathlib.Path, no_sdk_downloads: list[str]
) -> None:
    """An epoch over Azurite (connection string with the account key, so every GET is signed
    with Shared Key) reads the same samples as from local disk, and never through the SDK."""
    folder, _ = make_dataset(tmp_path, 40, 10, num_classes=4)
    url = azure_store.put(folder, "ds")

    def samples(source: str, options: dict[str, Any]) -> list[tuple[str, bytes]]:
        stream = StreamOptions(output="dict", storage_options=options, read_options=FAST)
        dataset = StreamingDataset(source, decode="raw", batch_size=8, seed=2, options=stream)
        pairs = (zip(batch["__key__"], batch["image"], strict=True) for batch in dataset)
        return sorted((key, bytes(image)) for pair in pairs for key, image in pair)

    read = samples(url, azure_store.options)
    assert len(read) == 40 and read == samples(str(folder), {})
    assert no_sdk_downloads == []
    assert azure_store.proxy.count("GET", ".tar") > 0, "read through the proxy, by GETs"


def test_a_sas_token_is_sent_in_the_url(
    azure_store: StoreUnderTest, tmp_path: pathlib.Path, no_sdk_downloads: list[str]
) -> None:
    """With a container SAS (no account key), ranged reads carry the token's query and work."""
    from azure.storage.blob import ContainerSasPermissions, generate_container_sas

    data = bytes(range(256)) * 64
    url = _blob(azure_store, tmp_path, data)
    sas = generate_container_sas(
        emulators.AZURE_ACCOUNT, BUCKET, account_key=emulators.AZURE_KEY,
        permission=ContainerSasPermissions(read=True, list=True),
        expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1),
    )  # fmt: skip
    endpoint = azure_store.options["connection_string"].split("BlobEndpoint=")[1].rstrip(";")
    options = {"connection_string": f"BlobEndpoint={endpoint};SharedAccessSignature={sas};"}
    store = Store(url, options, FAST)
    with store.open_read("blob.bin", 1000, 9000) as stream:
        assert stream.read() == data[1000:9000]
    fs, path = store.read_target("blob.bin")
    source = AzureBackend().range_source(fs, path, FAST)
    assert isinstance(source, AzureHttpSource) and source.account is None
    assert no_sdk_downloads == []


def test_a_blob_rewritten_between_reads_is_refused(
    azure_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    """Later GETs ask If-Match on the first answer's ETag: another version is a 412."""
    data = bytes(range(256)) * 64
    url = _blob(azure_store, tmp_path, data)
    store = Store(url, azure_store.options, FAST)
    fs, path = store.read_target("blob.bin")
    source = AzureBackend().range_source(fs, path, FAST)
    assert isinstance(source, AzureHttpSource) and source.account is not None
    body = source.open_body(0, 100)
    assert bytes(body.read_extent(100)) == data[:100]
    body.close()
    assert source.total_size == len(data) and source.version
    _filesystem(azure_store.write_options).pipe_file(path, b"another version" * 100)
    with pytest.raises(StatusError) as refused:
        source.open_body(100, 200)
    assert refused.value.status == 412


def test_a_wrong_account_key_is_a_denial(
    azure_store: StoreUnderTest, tmp_path: pathlib.Path
) -> None:
    """A request signed with another key is refused (403), named as access denied."""
    url = _blob(azure_store, tmp_path, b"x" * 1000)
    wrong = azure_store.options["connection_string"].replace(emulators.AZURE_KEY, "d3Jvbmc=")
    store = Store(url, {"connection_string": wrong}, ReadOptions(max_attempts=1))
    with pytest.raises(PermissionError, match="access denied"):
        store.open_read("blob.bin", 0, 100).read()


def test_other_credentials_read_through_the_sdk() -> None:
    """A token credential (Azure AD) has no key to sign with: the SDK's downloads read."""
    token = SimpleNamespace(get_token=lambda *scopes: None)
    service = SimpleNamespace(credential=token, url="https://acct.blob.core.windows.net/",
                              api_version="2026-10-06")  # fmt: skip
    fs = SimpleNamespace(service_client=service, split_path=lambda path: ("c", "b.tar", None))
    assert isinstance(AzureBackend().range_source(fs, "c/b.tar", FAST), AzureSource)
    anonymous = SimpleNamespace(service_client=SimpleNamespace(**{**vars(service),
                                                                  "credential": None}),
                                split_path=fs.split_path)  # fmt: skip
    source = AzureBackend().range_source(anonymous, "c/b.tar", FAST)
    assert isinstance(source, AzureHttpSource) and source.url.endswith("/c/b.tar")
