"""Azure Blob Storage (``az://container/prefix``) through the official ``azure-storage-blob``
client (``pip install 'spotwise[azureblob]'``, imported only when an ``az://`` location is used).

Which account, by reference only (never in a URI, a job file or a log):
``AZURE_STORAGE_CONNECTION_STRING`` (the Azure CLI's variable; also how Azurite and other
emulators are reached), else ``AZURE_STORAGE_ACCOUNT_URL`` (e.g. an emulator's
``http://127.0.0.1:10000/devstoreaccount1``) or ``AZURE_STORAGE_ACCOUNT`` (->
``https://ACCOUNT.blob.core.windows.net``) with ``DefaultAzureCredential`` (managed identity,
workload identity, ``az login``, service-principal variables).

Every object carries the CRC32C of its bytes in user metadata (``spotwise_crc32c``: Azure
metadata names are C# identifiers, so no hyphen), checked on every read; uploads also send each
request's Content-MD5 for the service to check on receipt. A chunked download is pinned to the
ETag of its first chunk, so an object overwritten mid-read is read again, never mixed.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any, overload

import crc32c

from spotwise.errors import ConfigError
from spotwise.registry import require
from spotwise.retry import RetryPolicy
from spotwise.storage.base import ObjectInfo
from spotwise.storage.objectstore import (
    BucketStore,
    ErrorTable,
    Failure,
    MiB,
    crc_hex,
    file_crc,
    integrity_error,
    is_network_error,
    reading_upload,
)

CRC_KEY = "spotwise_crc32c"
_FEATURE = "az:// checkpoint storage"
_ENV_HINT = (
    "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_STORAGE_ACCOUNT (or AZURE_STORAGE_ACCOUNT_URL) "
    "with a credential DefaultAzureCredential finds (managed identity, az login)"
)


def classify(exc: BaseException) -> Failure:
    """What to do about an exception from azure-core / azure-storage-blob / azure-identity."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "ClientAuthenticationError" in names or "CredentialUnavailableError" in names:
        return Failure.PERMISSION
    status = getattr(exc, "status_code", None)
    code = str(getattr(exc, "error_code", "") or "")
    if "HttpResponseError" in names and isinstance(status, int):
        if code == "ContainerNotFound":
            return Failure.NO_BUCKET
        if status in (401, 403):
            return Failure.PERMISSION
        if status == 404:
            return Failure.NOT_FOUND
        # 412 ConditionNotMet on a later chunk: the blob changed mid-download; read it again
        if status in (408, 412, 429) or status >= 500 or code == "Md5Mismatch":
            return Failure.RETRY
        return Failure.FATAL
    if is_network_error(exc):
        return Failure.RETRY
    return Failure.FATAL


def _lost_race(exc: BaseException) -> bool:
    """A conditional write refused: the blob exists (409/412 on If-None-Match: *) or changed
    (412 on If-Match)."""
    return getattr(exc, "status_code", None) in (409, 412)


class AzureBlobStorage(BucketStore):
    """A key space under ``az://container/prefix``; implements the ``Storage`` protocol."""

    scheme = "az"
    errors = ErrorTable(
        classify,
        vendor="Azure",
        container="container",
        create="az storage container create -n {name}",
        check="check AZURE_STORAGE_ACCOUNT / the connection string",
        permission_hint=f"{_ENV_HINT}; the identity needs the 'Storage Blob Data Contributor' "
        "role on the container",
        retry_hint="check the account URL and network, or raise RetryPolicy.max_attempts",
    )

    def __init__(
        self,
        container: str,
        prefix: str = "",
        *,
        connection_string: str | None = None,
        account_url: str | None = None,
        credential: Any = None,
        block_size: int = 32 * MiB,
        max_concurrency: int = 8,
        timeout_s: tuple[float, float] = (10.0, 60.0),
        retry: RetryPolicy | None = None,
        client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._locate(container, prefix, retry, sleep)
        if max_concurrency < 1 or block_size < 1:
            raise ConfigError("block_size and max_concurrency must be >= 1")
        self.container = container
        self.max_concurrency = max_concurrency
        self._client = client or self._connect(
            connection_string, account_url, credential, block_size, timeout_s
        )

    def _connect(
        self,
        connection_string: str | None,
        account_url: str | None,
        credential: Any,
        block_size: int,
        timeout_s: tuple[float, float],
    ) -> Any:
        blob = require("azure.storage.blob", "azureblob", _FEATURE)
        options = {
            "retry_total": 0,  # retries are ours (RetryPolicy), as on S3 and GCS
            "connection_timeout": timeout_s[0],
            "read_timeout": timeout_s[1],
            "max_single_put_size": block_size,
            "max_block_size": block_size,
            "max_single_get_size": block_size,
            "max_chunk_get_size": block_size,
        }
        connection_string = connection_string or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        if connection_string and not (account_url or credential):
            try:
                return blob.ContainerClient.from_connection_string(
                    connection_string, self.container, **options
                )
            except ValueError as exc:  # never echo the string: it holds the account key
                raise ConfigError(
                    "AZURE_STORAGE_CONNECTION_STRING is not a valid connection string",
                    hint="copy it from the portal (Access keys) or `az storage account "
                    "show-connection-string`",
                ) from exc
        account_url = account_url or os.environ.get("AZURE_STORAGE_ACCOUNT_URL")
        if not account_url and os.environ.get("AZURE_STORAGE_ACCOUNT"):
            account_url = f"https://{os.environ['AZURE_STORAGE_ACCOUNT']}.blob.core.windows.net"
        if not account_url:
            raise ConfigError(f"no Azure storage account for {self.uri}", hint=_ENV_HINT)
        if credential is None:
            identity = require("azure.identity", "azureblob", _FEATURE)
            credential = identity.DefaultAzureCredential()
        try:
            return blob.ContainerClient(account_url, self.container, credential=credential,
                                        **options)  # fmt: skip
        except ValueError as exc:
            raise ConfigError(
                f"invalid Azure storage account URL {account_url!r}",
                hint="use https://ACCOUNT.blob.core.windows.net (or an emulator's URL)",
            ) from exc

    def _upload(self, full: str, data: Any, crc: int, length: int, **conditions: Any) -> Any:
        return self._client.get_blob_client(full).upload_blob(
            data, length=length, metadata={CRC_KEY: crc_hex(crc)},
            max_concurrency=self.max_concurrency, validate_content=True, **conditions,
        )  # fmt: skip

    def _download(self, full: str, out: IO[bytes]) -> int | None:
        """Stream the blob into ``out``; returns the CRC32C recorded at upload (None if absent)."""
        downloader = self._client.get_blob_client(full).download_blob(
            max_concurrency=self.max_concurrency
        )
        downloader.readinto(out)
        value = (downloader.properties.metadata or {}).get(CRC_KEY)
        return int(value, 16) if value else None

    # -- Storage protocol ------------------------------------------------------------------------
    def put(self, key: str, data: bytes | Path) -> None:
        full = self._full(key)
        if not isinstance(data, Path):
            crc = crc32c.crc32c(data)
            self._call(
                f"put {key!r}", lambda: self._upload(full, data, crc, len(data), overwrite=True)
            )
            return
        with reading_upload(data):
            size = data.stat().st_size
            crc = file_crc(data)

        def upload() -> None:
            # above block_size the client stages blocks in parallel, then commits the block list
            with open(data, "rb") as fh:
                self._upload(full, fh, crc, size, overwrite=True)

        self._call(f"put {key!r}", upload)

    @overload
    def get(self, key: str, dest: None = None) -> bytes: ...
    @overload
    def get(self, key: str, dest: Path) -> None: ...
    def get(self, key: str, dest: Path | None = None) -> bytes | None:
        full = self._full(key)
        if dest is None:
            return self._call(f"get {key!r}", lambda: self._fetch(key, full))
        self._call(
            f"get {key!r}", lambda: self._client.get_blob_client(full).get_blob_properties()
        )  # a missing blob fails before any file is made
        self._download_whole(key, dest, lambda out: self._download(full, out))
        return None

    def _fetch(self, key: str, full: str) -> bytes:
        buffer = io.BytesIO()
        expected = self._download(full, buffer)
        data = buffer.getvalue()
        if expected is not None and crc32c.crc32c(data) != expected:
            raise integrity_error(self.uri, key)
        return data

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        def entries(full: str) -> Iterable[tuple[str, int]]:
            blobs = self._client.list_blobs(name_starts_with=full)
            return ((b.name, int(b.size or 0)) for b in blobs)

        return self._listing(prefix, entries)

    def delete(self, key: str) -> None:
        self._delete(key, lambda full: self._client.get_blob_client(full).delete_blob())

    # -- compare-and-swap (ObjectLeases) ---------------------------------------------------------
    def put_if(self, key: str, data: bytes, *, etag: str | None) -> str | None:
        """Create ``key`` only if absent (``If-None-Match: *``) or replace it only if it still
        has ``etag`` (``If-Match``). Returns the new ETag, or None when another writer got there
        first."""
        full = self._full(key)
        if etag is None:
            conditions: dict[str, Any] = {"overwrite": False}
        else:
            core = require("azure.core", "azureblob", _FEATURE)
            match = core.MatchConditions.IfNotModified
            conditions = {"overwrite": True, "etag": etag, "match_condition": match}
        crc = crc32c.crc32c(data)

        def put() -> str | None:
            try:
                result = self._upload(full, data, crc, len(data), **conditions)
            except Exception as exc:
                if _lost_race(exc):
                    return None
                raise
            return str(result["etag"])

        return self._call(f"conditional put {key!r}", put)

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """The object and its ETag (for a later ``put_if``), or None if it does not exist."""
        full = self._full(key)

        def fetch() -> tuple[bytes, str] | None:
            try:
                downloader = self._client.get_blob_client(full).download_blob()
            except Exception as exc:
                if classify(exc) is Failure.NOT_FOUND:
                    return None
                raise
            return downloader.readall(), str(downloader.properties.etag)

        return self._call(f"get {key!r}", fetch)
