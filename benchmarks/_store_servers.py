"""The stores of ``benchmarks/stores.py``, each its real server on 127.0.0.1.

A store's context manager starts its server, publishes the benchmark's dataset folders on it
(``folder/<name>/...`` becomes ``<name>/...`` on the store, the files as they are) and yields a
:class:`Served`: the server's endpoint (where a latency proxy forwards to) and, for a proxy's
endpoint, how shardstream reads a dataset through it (URL and storage options) and how the
store's own client reads its objects (:mod:`_store_clients`). Everything yielded is plain data
(JSON), handed to the row processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")  # see tests/stores

from s3 import s3_server
from s3_latency import options_for

from tests.stores import emulators
from tests.stores.httpserver import RangeServer

BUCKET = "bench"


@dataclasses.dataclass
class Served:
    """A running store with the datasets on it.

    Attributes:
        endpoint_url: The server's ``http://127.0.0.1:PORT`` (a latency proxy goes in front).
        locate: ``locate(endpoint_url, name)``: shardstream's URL and storage options for the
            dataset ``name`` read through ``endpoint_url``.
        client: ``client(endpoint_url)``: the plain client's settings (``{"store": ...}``).
    """

    endpoint_url: str
    locate: Callable[[str, str], tuple[str, dict[str, Any]]]
    client: Callable[[str], dict[str, Any]]


def _files(folder: Path) -> Iterator[tuple[Path, str]]:
    """Every dataset file under ``folder`` and its key (``<dataset>/<file>``)."""
    for dataset in sorted(path for path in folder.iterdir() if path.is_dir()):
        for path in sorted(dataset.iterdir()):
            if path.is_file():
                yield path, f"{dataset.name}/{path.name}"


@contextlib.contextmanager
def http_store(folder: Path) -> Iterator[Served]:
    """The project's Range-capable HTTP/1.1 server (tests/stores/httpserver.py) on ``folder``."""
    server = RangeServer(str(folder))
    try:
        yield Served(server.url, lambda endpoint, name: (f"{endpoint}/{name}", {}),
                     lambda endpoint: {"store": "http", "base": endpoint})  # fmt: skip
    finally:
        server.stop()


@contextlib.contextmanager
def gcs_store(folder: Path) -> Iterator[Served]:
    """fake-gcs-server (from its wheel), objects in memory."""
    import gcsfs

    with emulators.fake_gcs_server() as url:
        options = {"token": "anon", "project": BUCKET}
        fs = gcsfs.GCSFileSystem(endpoint_url=url, **options, skip_instance_cache=True)
        fs.mkdir(BUCKET)
        for path, key in _files(folder):
            fs.put_file(str(path), f"{BUCKET}/{key}")
        yield Served(
            url, lambda endpoint, name: (f"gs://{BUCKET}/{name}", {"endpoint_url": endpoint,
                                                                   **options}),
            lambda endpoint: {"store": "gcs", "endpoint": endpoint, "bucket": BUCKET},
        )  # fmt: skip


@contextlib.contextmanager
def azure_store(folder: Path) -> Iterator[Served]:
    """Azurite (from npm), blobs in a temporary folder."""
    import adlfs

    with tempfile.TemporaryDirectory() as data, emulators.azurite(Path(data)) as url:
        direct = {"connection_string": emulators.azure_connection_string(url)}
        fs = adlfs.AzureBlobFileSystem(**direct, skip_instance_cache=True)
        fs.mkdir(BUCKET)
        for path, key in _files(folder):
            fs.put_file(str(path), f"{BUCKET}/{key}")
        account = "/" + emulators.AZURE_ACCOUNT

        def connection(endpoint: str) -> str:
            return emulators.azure_connection_string(endpoint + account)

        yield Served(
            url.removesuffix(account),
            lambda endpoint, name: (f"az://{BUCKET}/{name}",
                                    {"connection_string": connection(endpoint)}),
            lambda endpoint: {"store": "azure", "connection_string": connection(endpoint),
                              "container": BUCKET},
        )  # fmt: skip


def s3_store(kind: str) -> Callable[[Path], contextlib.AbstractContextManager[Served]]:
    """An S3 server of ``kind`` (``radosgw``, as benchmarks/s3_latency.py, or ``moto``)."""

    @contextlib.contextmanager
    def start(folder: Path) -> Iterator[Served]:
        from s3server.server import make_bucket

        with s3_server(kind) as info:
            s3 = make_bucket(info, BUCKET)
            for path, key in _files(folder):
                s3.upload_file(str(path), BUCKET, key)
            yield Served(
                info["endpoint_url"],
                lambda endpoint, name: (f"s3://{BUCKET}/{name}", options_for(info, endpoint)),
                lambda endpoint: {"store": "s3", **info, "endpoint_url": endpoint},
            )  # fmt: skip

    return start


def stores(s3_kind: str) -> dict[str, Callable[[Path], contextlib.AbstractContextManager[Served]]]:
    """Every store by name (the order of the table)."""
    return {"http": http_store, "gcs": gcs_store, "azure": azure_store, "s3": s3_store(s3_kind)}
