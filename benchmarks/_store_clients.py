"""Plain loops of ranged GETs with each store's own client: the CPU baseline of stores.py.

:func:`plain_gets` reads ``(key, start, end)`` ranges on a number of threads with the client a
user of that store would reach for, set up as its documentation shows, each thread with its own
client (none of them promises to be safe across threads): ``requests`` for HTTP, Google's
``google-cloud-storage`` for GCS (no checksum: a range has none to check), Microsoft's
``azure-storage-blob`` for Azure, and boto3 for S3 (``s3_latency.plain_gets``). Every byte is
read into memory and dropped, as shardstream's path does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from s3_latency import plain_gets as s3_plain_gets

Range = tuple[str, int, int]


def _per_thread(make: Callable[[], Any]) -> Callable[[], Any]:
    """``get()``: this thread's client, made on its first call."""
    local = threading.local()

    def get() -> Any:
        if not hasattr(local, "client"):
            local.client = make()
        return local.client

    return get


def _http(config: dict[str, Any]) -> Callable[[Range], int]:
    import requests

    session = _per_thread(requests.Session)

    def get(item: Range) -> int:
        key, start, end = item
        response = session().get(f"{config['base']}/{key}",
                                 headers={"Range": f"bytes={start}-{end - 1}"})  # fmt: skip
        response.raise_for_status()
        return len(response.content)

    return get


def _gcs(config: dict[str, Any]) -> Callable[[Range], int]:
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    def make() -> Any:
        client = storage.Client(project=config["bucket"], credentials=AnonymousCredentials(),
                                client_options={"api_endpoint": config["endpoint"]})  # fmt: skip
        return client.bucket(config["bucket"])

    bucket = _per_thread(make)

    def get(item: Range) -> int:
        key, start, end = item
        blob = bucket().blob(key)
        return len(blob.download_as_bytes(start=start, end=end - 1, checksum=None))

    return get


def _azure(config: dict[str, Any]) -> Callable[[Range], int]:
    from azure.storage.blob import BlobServiceClient

    service = _per_thread(lambda: BlobServiceClient.from_connection_string(
        config["connection_string"]))  # fmt: skip

    def get(item: Range) -> int:
        key, start, end = item
        blob = service().get_blob_client(config["container"], key)
        return len(blob.download_blob(offset=start, length=end - start,
                                      max_concurrency=1).readall())  # fmt: skip

    return get


_CLIENTS = {"http": _http, "gcs": _gcs, "azure": _azure}


def plain_gets(args: tuple[dict[str, Any], list[Range], int]) -> int:
    """Bytes of ``ranges`` read with the store's own client on ``threads`` threads.

    ``config["store"]`` names the store; the rest is what its client needs (see
    ``_store_servers.Served.client``).
    """
    config, ranges, threads = args
    if config["store"] == "s3":
        return s3_plain_gets(args)
    get = _CLIENTS[config["store"]](config)
    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(get, ranges))
