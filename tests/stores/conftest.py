"""Every store's real server on 127.0.0.1 with the fault proxy in front, behind one interface.

A store fixture yields a :class:`StoreUnderTest`: where datasets are put (``put``: a folder
built locally, copied onto the store as it would be published), the URL and options that read
them through the fault proxy, the proxy itself, and whether the store can be written to. The
shared tests in this folder run on each (``any_store``); a new store adds one fixture here.
"""

from __future__ import annotations

import dataclasses
import pathlib
import shutil
from collections.abc import Callable, Iterator
from typing import Any

import fsspec
import pytest

from tests.s3.faultproxy import FaultProxy
from tests.stores.httpserver import RangeServer


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


@pytest.fixture(params=["http"])
def any_store(request: pytest.FixtureRequest) -> StoreUnderTest:
    """Each store in turn (the shared tests run on every one)."""
    return request.getfixturevalue(f"{request.param}_store")  # type: ignore[no-any-return]
