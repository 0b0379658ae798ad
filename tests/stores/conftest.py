"""Every store's real server on 127.0.0.1 with the fault proxy in front, behind one interface.

A store fixture yields a :class:`StoreUnderTest`: where datasets are put (``put``: a folder
built locally, copied onto the store as it would be published), the URL and options that read
them through the fault proxy, the proxy itself, and whether the store can be written to. The
shared tests in this folder run on each (``any_store``); a new store adds one fixture here.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import pathlib
import shutil
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import fsspec
import pytest

from tests.s3.faultproxy import FaultProxy
from tests.stores import emulators
from tests.stores.httpserver import RangeServer

#: gcsfs 2026 asks a bucket's type over gRPC first, which an emulator never answers (60 s).
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"
BUCKET = "shardstream-test"
_NAMES = itertools.count()


@dataclasses.dataclass
class StoreUnderTest:
    """One store's server with the fault proxy in front.

    Attributes:
        name: The store's kind (``"http"``...).
        put: ``put(folder, name)`` publishes a local dataset folder on the store and returns
            its URL (the same URL reads through the proxy with ``options``).
        options: Storage options that read through the fault proxy.
        proxy: The fault proxy (rules and counters cleared per test).
        writable: Whether shardstream can write to the store.
        write_url: ``write_url(name)``: a URL to build to directly (writable stores).
        write_options: Storage options that write directly to the server.
    """

    name: str
    put: Callable[[pathlib.Path, str], str]
    options: dict[str, Any]
    proxy: FaultProxy
    writable: bool = False
    write_url: Callable[[str], str] | None = None
    write_options: dict[str, Any] = dataclasses.field(default_factory=dict)


@pytest.fixture(scope="session")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RangeServer]:
    server = RangeServer(str(tmp_path_factory.mktemp("http-root")))
    yield server
    server.stop()


@pytest.fixture(scope="session")
def http_proxy(http_server: RangeServer) -> Iterator[FaultProxy]:
    proxy = FaultProxy(http_server.address)
    yield proxy
    proxy.stop()


@pytest.fixture
def http_store(http_server: RangeServer, http_proxy: FaultProxy) -> Iterator[StoreUnderTest]:
    """The project's Range-capable HTTP/1.1 server behind the fault proxy (read-only)."""
    root = pathlib.Path(http_server.root)
    used: list[pathlib.Path] = []

    def put(folder: pathlib.Path, name: str) -> str:
        target = root / name
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder, target)
        used.append(target)
        return f"{http_proxy.endpoint_url}/{name}"

    http_proxy.clear()
    http_server.clear()
    fsspec.AbstractFileSystem.clear_instance_cache()
    yield StoreUnderTest("http", put, {}, http_proxy)
    http_proxy.clear()
    for target in used:
        shutil.rmtree(target, ignore_errors=True)


def _address(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].split("/", 1)[0].split(":")
    return host, int(port)


def _uploader(fs: Any, root: str, scheme: str) -> Callable[[pathlib.Path, str], str]:
    """``put(folder, name)``: the folder's files uploaded under ``root/name-N``; its URL."""

    def put(folder: pathlib.Path, name: str) -> str:
        prefix = f"{root}/{name}-{next(_NAMES)}"
        for path in sorted(folder.iterdir()):
            if path.is_file():
                fs.put_file(str(path), f"{prefix}/{path.name}")
        return f"{scheme}://{prefix}"

    return put


@pytest.fixture(scope="session")
def gcs_server() -> Iterator[str]:
    import gcsfs

    with emulators.fake_gcs_server() as url:
        gcsfs.GCSFileSystem(**_gcs_options(url), skip_instance_cache=True).mkdir(BUCKET)
        yield url


@pytest.fixture(scope="session")
def gcs_proxy(gcs_server: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(_address(gcs_server))
    yield proxy
    proxy.stop()


def _gcs_options(endpoint_url: str) -> dict[str, Any]:
    return {"endpoint_url": endpoint_url, "token": "anon", "project": "shardstream-test"}


@pytest.fixture
def gcs_store(gcs_server: str, gcs_proxy: FaultProxy) -> Iterator[StoreUnderTest]:
    """fake-gcs-server (GCS's JSON API, in memory) behind the fault proxy."""
    import gcsfs

    fsspec.AbstractFileSystem.clear_instance_cache()
    gcsfs.GCSFileSystem.clear_instance_cache()
    direct = _gcs_options(gcs_server)
    fs = gcsfs.GCSFileSystem(**direct, skip_instance_cache=True)
    gcs_proxy.clear()
    yield StoreUnderTest("gcs", _uploader(fs, BUCKET, "gs"), _gcs_options(gcs_proxy.endpoint_url),
                         gcs_proxy, True, lambda name: f"gs://{BUCKET}/{name}-{next(_NAMES)}",
                         direct)  # fmt: skip
    gcs_proxy.clear()


@pytest.fixture(scope="session")
def azure_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import adlfs

    with emulators.azurite(tmp_path_factory.mktemp("azurite")) as url:
        options = {"connection_string": emulators.azure_connection_string(url)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # adlfs warns when it reads no container properties
            adlfs.AzureBlobFileSystem(**options, skip_instance_cache=True).mkdir(BUCKET)
        yield url


@pytest.fixture(scope="session")
def azure_proxy(azure_server: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(_address(azure_server))
    yield proxy
    proxy.stop()


@pytest.fixture
def azure_store(azure_server: str, azure_proxy: FaultProxy) -> Iterator[StoreUnderTest]:
    """Azurite (Azure Blob Storage's emulator, from npm) behind the fault proxy."""
    import adlfs

    fsspec.AbstractFileSystem.clear_instance_cache()
    adlfs.AzureBlobFileSystem.clear_instance_cache()
    direct = {"connection_string": emulators.azure_connection_string(azure_server)}
    proxied = azure_proxy.endpoint_url + "/" + emulators.AZURE_ACCOUNT
    fs = adlfs.AzureBlobFileSystem(**direct, skip_instance_cache=True)
    azure_proxy.clear()
    yield StoreUnderTest(
        "azure", _uploader(fs, BUCKET, "az"),
        {"connection_string": emulators.azure_connection_string(proxied)}, azure_proxy, True,
        lambda name: f"az://{BUCKET}/{name}-{next(_NAMES)}", direct,
    )  # fmt: skip
    azure_proxy.clear()


@pytest.fixture(params=["http", "gcs", "azure"])
def any_store(request: pytest.FixtureRequest) -> StoreUnderTest:
    """Each store in turn (the shared tests run on every one)."""
    return request.getfixturevalue(f"{request.param}_store")  # type: ignore[no-any-return]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """gcsfs and adlfs hand aiohttp whole upload parts as bytes, which aiohttp warns about
    (a ResourceWarning, shown to nobody outside tests): not a problem of shardstream's."""
    here = pathlib.Path(__file__).parent
    for item in items:
        if here in pathlib.Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.filterwarnings(
                "ignore:Sending a large body directly:ResourceWarning"))  # fmt: skip
