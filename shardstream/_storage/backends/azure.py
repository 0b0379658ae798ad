"""Azure Blob Storage (``az://``, ``abfs://``, ``abfss://``): ranged downloads pinned to an ETag.

Listing and writing go through adlfs (a block blob is published when its block list is
committed, at close). Reads with an account key, a SAS token or no credentials are Get Blob
requests on the pooled HTTP client of :mod:`.http` (:class:`AzureHttpSource`), signed here
with the key (Shared Key) or carrying the SAS in the URL: each runs in the fetch pool's thread
that asks for it, at a fraction of the Azure SDK's CPU per request (its policies, and
aiohttp's hop to a thread per request). Reads with other credentials (Azure AD tokens) are
ranged ``download_blob`` calls of adlfs's own async client, run on its event loop
(:class:`AzureSource`). Either way: as many in flight as the measured first-byte latency asks,
announced ranges fetched ahead, retries that resume at the byte reached. The first answer's
``ETag`` pins the version: later downloads are conditional on it (``If-Match``), so a
rewritten blob fails with "changed while it was being read" instead of mixing. An exclusive
create is an upload with ``If-None-Match: *``, so two writers never both win.
"""

from __future__ import annotations

import base64
import email.utils
import hashlib
import hmac
import http.client
import urllib.parse
from typing import Any

from shardstream._storage.backends.generic import Backend
from shardstream._storage.backends.http import HttpClient, HttpSource, connection_pool
from shardstream._storage.options import ReadOptions
from shardstream._storage.remote.retry import StatusError

__all__ = ["AzureBackend", "AzureHttpSource", "AzureSource"]

#: The standard headers of a Shared Key string to sign, in its order (Blob service, 2009-09-19
#: and later); ``x-ms-*`` headers and the resource follow.
_SIGNED_HEADERS = (
    "content-encoding", "content-language", "content-length", "content-md5", "content-type",
    "date", "if-modified-since", "if-match", "if-none-match", "if-unmodified-since", "range",
)  # fmt: skip


class AzureBackend(Backend):
    """Azure Blob Storage through adlfs (``az://container/prefix``)."""

    name = "azure"
    atomic_put = True
    pooled_reads = True
    sizes_from_gets = True
    credentials = (
        "storage options (--storage-option account_name=NAME with account_key=..., "
        "sas_token=... or connection_string=..., or the same in storage_options), or the "
        "environment (AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT_NAME with "
        "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN)"
    )

    def range_source(
        self, fs: Any, path: str, options: ReadOptions
    ) -> AzureHttpSource | AzureSource:
        """Plain signed GETs where the credentials allow; the SDK's downloads otherwise."""
        direct = AzureHttpSource.of(fs, path, options.timeout_s)
        return direct if direct is not None else AzureSource(fs, path, options.timeout_s)

    def create_exclusive(
        self, fs: Any, path: str, data: bytes, shown: str, options: ReadOptions
    ) -> bool:
        """An upload with ``If-None-Match: *``: it fails if the blob exists."""
        try:
            fs.pipe_file(path, data, overwrite=False)
        except FileExistsError:
            return False
        finally:
            self.forget_listings(fs, path)
        return True


class _Body:
    """A downloaded range, handed out in extents."""

    def __init__(self, data: bytes) -> None:
        self._view, self._offset = memoryview(data), 0

    def read_extent(self, num_bytes: int) -> memoryview:
        extent = self._view[self._offset : self._offset + num_bytes]
        self._offset += len(extent)
        return extent

    def close(self) -> None:
        """Nothing is held."""


class AzureHttpSource(HttpSource):
    """Get Blob requests of one blob on the pooled HTTP client, conditional on its ETag.

    Signed with the account key (``Authorization: SharedKey``), or carrying a SAS token in the
    URL, or neither (a public container). :meth:`of` makes one where the filesystem's
    credentials are of these kinds.

    Args:
        client: The pooled HTTP connections.
        url: The blob's URL (with the SAS token's query, if any).
        account: ``(account name, decoded account key)`` to sign with, or None.
        api_version: The ``x-ms-version`` every request states (the SDK's).
    """

    def __init__(
        self, client: HttpClient, url: str, account: tuple[str, bytes] | None, api_version: str
    ) -> None:
        super().__init__(client, url)
        self.account, self.api_version = account, api_version
        self._resource = urllib.parse.urlsplit(url).path

    @classmethod
    def of(cls, fs: Any, path: str, timeout_s: float) -> AzureHttpSource | None:
        """The source of ``path`` on adlfs's ``fs``; None for credentials signed otherwise
        (tokens) or a blob version (``path?versionid=...``), which the SDK's path reads."""
        service = getattr(fs, "service_client", None)
        credential: Any = getattr(service, "credential", None)
        key = getattr(credential, "account_key", None)
        if service is None or (credential is not None and key is None):
            return None
        container, blob, version_id = fs.split_path(path)
        if version_id:
            return None
        base, _, query = str(service.url).partition("?")
        url = base.rstrip("/") + "/" + urllib.parse.quote(container) + "/"
        url += urllib.parse.quote(blob, safe="~/") + (f"?{query}" if query else "")
        account = None
        if key is not None:
            try:
                account = (str(credential.account_name), base64.b64decode(key))
            except ValueError:  # not base64: the SDK's path says what is wrong with it
                return None
        client = HttpClient(connection_pool(timeout_s), {})
        return cls(client, url, account, str(service.api_version))

    def _conditions(self, headers: dict[str, str]) -> None:
        """Later GETs ask ``If-Match`` on the first answer's ETag (412 if it changed)."""
        if self.version is not None:
            headers["If-Match"] = self.version

    def _send(self, method: str, headers: dict[str, str]) -> http.client.HTTPResponse:
        sent = {name.lower(): value for name, value in headers.items()}
        if "range" in sent:  # Azure's own header: the standard one is ignored by old versions
            sent["x-ms-range"] = sent.pop("range")
        sent["x-ms-version"] = self.api_version
        sent["x-ms-date"] = email.utils.formatdate(usegmt=True)
        if self.account is not None:
            sent["authorization"] = self._authorization(method, sent, *self.account)
        return super()._send(method, sent)

    def _authorization(self, method: str, headers: dict[str, str], name: str, key: bytes) -> str:
        """``SharedKey name:signature`` of this request (Shared Key's string to sign)."""
        own = "".join(f"{k}:{headers[k]}\n" for k in sorted(headers) if k.startswith("x-ms-"))
        text = "\n".join([method, *(headers.get(k, "") for k in _SIGNED_HEADERS)]) + "\n"
        text += own + f"/{name}{self._resource}"
        digest = hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest()
        return f"SharedKey {name}:{base64.b64encode(digest).decode()}"


class AzureSource:
    """Ranged downloads of one blob, conditional on the ETag of the first answer.

    Args:
        fs: The adlfs filesystem (its async service client and event loop).
        path: ``container/blob``.
        timeout_s: Seconds a download may take before it counts as failed.

    Attributes:
        etag: The blob's ETag once known.
        total_size: The blob's size once known.
    """

    def __init__(self, fs: Any, path: str, timeout_s: float) -> None:
        self.fs, self.path, self.timeout_s = fs, path, timeout_s
        self.etag: str | None = None
        self.total_size: int | None = None

    def stat(self) -> tuple[int, str | None]:
        """The blob's size and ETag (a properties request)."""
        info = _translated(lambda: self.fs.info(self.path, refresh=True))
        self.etag = self.etag or info.get("etag")
        self.total_size = int(info["size"])
        return self.total_size, self.etag

    def open_body(self, offset: int, end: int) -> _Body:
        """Download bytes ``[offset, end)``; learn the size and ETag from the answer."""
        from fsspec.asyn import sync

        try:
            download = self._download(offset, end - offset)
            data, etag, size = _translated(
                lambda: sync(self.fs.loop, lambda: download, timeout=self.timeout_s)
            )
        except StatusError as error:
            if error.status != 416:
                raise
            self.stat()  # the range starts at or past the blob's end: learn its real size
            return _Body(b"")
        self.etag = self.etag or etag
        self.total_size = size
        return _Body(data)

    async def _download(self, offset: int, length: int) -> tuple[bytes, str | None, int]:
        from azure.core import MatchConditions

        container, blob, version_id = self.fs.split_path(self.path)
        condition: dict[str, Any] = {}
        if self.etag is not None:
            condition = {"etag": self.etag, "match_condition": MatchConditions.IfNotModified}
        async with self.fs.service_client.get_blob_client(container=container, blob=blob) as bc:
            stream = await bc.download_blob(
                offset=offset, length=length, version_id=version_id, max_concurrency=1,
                **condition,
            )  # fmt: skip
            data = await stream.readall()
            # properties.size is the range's; content_range ("bytes a-b/total") the blob's
            total = str(stream.properties.content_range or "").rpartition("/")[2]
            size = int(total) if total.isdigit() else offset + len(data)
            return data, stream.properties.etag, size


def _translated(call: Any) -> Any:
    """``call()``, with the Azure SDK's errors as the retrier classifies them."""
    from azure.core import exceptions

    try:
        return call()
    except exceptions.ResourceNotFoundError as error:
        raise FileNotFoundError(str(error).splitlines()[0]) from error
    except exceptions.ClientAuthenticationError as error:
        raise PermissionError(str(error).splitlines()[0]) from error
    except exceptions.HttpResponseError as error:
        status = int(getattr(error, "status_code", 0) or 0)
        code = str(getattr(error, "error_code", "") or "")
        raise StatusError(status or 500, code, str(error).splitlines()[0]) from error
    except exceptions.AzureError as error:  # no answer: the connection failed (retried)
        raise ConnectionError(str(error).splitlines()[0]) from error
