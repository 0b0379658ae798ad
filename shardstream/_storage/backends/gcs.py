"""Google Cloud Storage (``gs://``, ``gcs://``): ranged media GETs pinned to a generation.

Listing and writing go through gcsfs (its uploads publish an object only when they complete).
Reads are the JSON API's media downloads sent on the pooled HTTP client of :mod:`.http`
(:class:`GcsSource`, with gcsfs's credentials): as many in flight as the measured first-byte
latency asks, announced ranges fetched ahead, retries that resume at the byte reached. The
first answer's ``x-goog-generation`` pins the version: later GETs ask ``ifGenerationMatch`` on
it, so a rewritten object fails with "changed while it was being read" instead of mixing. An
exclusive create is an upload with ``ifGenerationMatch=0``, so two writers never both win.

gcsfs 2026 first asks a bucket's type over gRPC; against an emulator set
``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false`` (the tests do), or each call waits for a timeout.
"""

from __future__ import annotations

import http.client
from typing import Any

from shardstream._storage.backends.generic import Backend
from shardstream._storage.backends.http import HttpClient, HttpSource, connection_pool
from shardstream._storage.options import ReadOptions

__all__ = ["GcsBackend", "GcsSource"]


class GcsBackend(Backend):
    """Google Cloud Storage through gcsfs (``gs://bucket/prefix``)."""

    name = "gcs"
    atomic_put = True
    pooled_reads = True
    sizes_from_gets = True
    credentials = (
        "a storage option (--storage-option token=/path/to/service-account.json, or "
        "storage_options={'token': ...}), the environment (GOOGLE_APPLICATION_CREDENTIALS), "
        "or gcloud's default credentials (gcloud auth application-default login)"
    )

    def range_source(self, fs: Any, path: str, options: ReadOptions) -> GcsSource:
        return GcsSource(fs, path, HttpClient(connection_pool(options.timeout_s), {}))

    def create_exclusive(
        self, fs: Any, path: str, data: bytes, shown: str, options: ReadOptions
    ) -> bool:
        """An upload with ``ifGenerationMatch=0``: it fails if the object exists."""
        try:
            fs.pipe_file(path, data, mode="create")
        except FileExistsError:
            return False
        finally:
            self.forget_listings(fs, path)
        return True


class GcsSource(HttpSource):
    """Media GETs of one GCS object, pinned to the generation of the first answer.

    Args:
        fs: The gcsfs filesystem (endpoint, credentials, paths).
        path: ``bucket/key`` (a ``#generation`` suffix reads that generation).
        client: The pooled HTTP connections.
    """

    def __init__(self, fs: Any, path: str, client: HttpClient) -> None:
        super().__init__(client, fs.url(path))
        self.fs, self.path = fs, path
        self.generation: str | None = None

    def _url(self) -> str:
        if self.generation is None:
            return self.url
        return f"{self.url}&ifGenerationMatch={self.generation}"

    def _headers(self) -> dict[str, str]:
        headers = dict(self.client.headers)
        credentials = getattr(self.fs, "credentials", None)
        if credentials is not None:
            credentials.apply(headers)  # refreshes an expired token first
        return headers

    def _conditions(self, headers: dict[str, str]) -> None:
        """The generation is in the URL (``ifGenerationMatch``): nothing more to ask."""

    def _check_version(self, response: http.client.HTTPResponse) -> None:
        super()._check_version(response)
        found = response.getheader("x-goog-generation")
        if found is not None and self.generation is None:
            self.generation = found

    def stat(self) -> tuple[int, str | None]:
        """The object's size and generation (gcsfs's metadata request)."""
        info = self.fs.info(self.path)
        self.generation = self.generation or str(info.get("generation") or "") or None
        self.total_size = int(info["size"])
        return self.total_size, self.generation
