"""A real S3-compatible server (moto_server) on 127.0.0.1, a fault proxy in front, and helpers.

One server runs per test session; every test starts from an empty server (``POST
/moto-api/reset``), a fresh bucket and fresh fsspec instances. Credentials are dummies, but the
secret is a distinctive string so tests can check it never leaks.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest

from tests.s3.faultproxy import FaultProxy
from tests.s3.s3env import ACCESS_KEY, BUCKET, SECRET_KEY, make_fs


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _moto_command(port: int) -> list[str]:
    executable = shutil.which("moto_server")
    if executable:
        return [executable, "-H", "127.0.0.1", "-p", str(port)]
    return [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]


def _wait_healthy(url: str, process: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"moto_server exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url + "/moto-api/", timeout=2):
                return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"moto_server at {url} did not answer within {timeout_s}s")


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto_server started for this session."""
    port = _free_port()
    env = {**os.environ, "AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY}
    process = subprocess.Popen(
        _moto_command(port), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.fixture(scope="session")
def fault_proxy(moto_endpoint: str) -> Iterator[FaultProxy]:
    """The session's fault-injecting proxy in front of moto (rules cleared per test)."""
    host, port = moto_endpoint.rsplit("//", 1)[1].split(":")
    proxy = FaultProxy((host, int(port)))
    yield proxy
    proxy.stop()


def _clear_fsspec_instances() -> None:
    fsspec.AbstractFileSystem.clear_instance_cache()
    try:
        import s3fs
    except ImportError:  # pragma: no cover
        return
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture(autouse=True)
def s3_env(
    moto_endpoint: str, fault_proxy: FaultProxy, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Dummy credentials, an empty server with one bucket, no rules, fresh fsspec instances."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    request = urllib.request.Request(moto_endpoint + "/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass
    fault_proxy.clear()
    _clear_fsspec_instances()
    make_fs(moto_endpoint).mkdir(BUCKET)
    yield
    fault_proxy.clear()
    _clear_fsspec_instances()


@pytest.fixture
def storage_options(moto_endpoint: str) -> dict[str, Any]:
    """Options straight to moto, with the (dummy) secret passed explicitly."""
    return {"endpoint_url": moto_endpoint, "key": ACCESS_KEY, "secret": SECRET_KEY}


@pytest.fixture
def proxy_options(fault_proxy: FaultProxy) -> dict[str, Any]:
    """Options through the fault proxy, with the (dummy) secret passed explicitly."""
    return {"endpoint_url": fault_proxy.endpoint_url, "key": ACCESS_KEY, "secret": SECRET_KEY}


@pytest.fixture
def moto_fs(moto_endpoint: str) -> Any:
    """An s3fs filesystem straight to moto, for setting up and checking objects."""
    return make_fs(moto_endpoint)


@pytest.fixture(params=[0.0, 0.03], ids=["", "30ms-first-byte"])
def store_latency(request: pytest.FixtureRequest, s3_env: None, fault_proxy: FaultProxy) -> float:
    """Runs a fault test twice: as is, and with every answer's first byte held back 30 ms (as a
    data center's object store answers), so faults stay exact under latency too."""
    fault_proxy.delay_s = request.param
    return float(request.param)
