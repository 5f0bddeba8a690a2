"""Google Cloud Storage (``gs://bucket/prefix``) through the official ``google-cloud-storage``
client (``pip install 'spotwise[gcs]'``, imported only when a ``gs://`` location is used).

Credentials are Application Default Credentials (a VM's service account, workload identity,
``GOOGLE_APPLICATION_CREDENTIALS``, ``gcloud auth application-default login``); the endpoint is
the SDK's own ``STORAGE_EMULATOR_HOST`` for an emulator (then no credentials are needed).
Every object carries the CRC32C of its bytes in user metadata, checked on every read, as on S3;
GCS also checks its own CRC32C of every upload and download on the wire. Reads pin the
object's generation, so an object overwritten mid-read is read again, never mixed.
"""

from __future__ import annotations

import logging
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
    crc_metadata,
    expected_crc,
    file_crc,
    integrity_error,
    is_network_error,
    reading_upload,
)

log = logging.getLogger(__name__)

_RESUMABLE_QUANTUM = 256 * 1024  # GCS resumable chunks are multiples of 256 KiB


def classify(exc: BaseException) -> Failure:
    """What to do about an exception from google-cloud-storage / google-auth / requests."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "DataCorruption" in names:
        return Failure.CORRUPT
    if names & {"DefaultCredentialsError", "RefreshError"}:
        return Failure.PERMISSION
    code = getattr(exc, "code", None)
    if "GoogleAPICallError" in names and isinstance(code, int):
        if code in (401, 403):
            return Failure.PERMISSION
        if code == 404:
            return Failure.NO_BUCKET if _names_bucket(str(exc)) else Failure.NOT_FOUND
        # 412: a read pinned to a generation that was overwritten meanwhile; read again
        if code in (408, 412, 429) or code >= 500:
            return Failure.RETRY
        return Failure.FATAL
    if "TransportError" in names or is_network_error(exc):
        return Failure.RETRY
    return Failure.FATAL


def _names_bucket(message: str) -> bool:
    return "bucket does not exist" in message.lower()


class GCSStorage(BucketStore):
    """A key space under ``gs://bucket/prefix``; implements the ``Storage`` protocol."""

    scheme = "gs"
    errors = ErrorTable(
        classify,
        vendor="GCS",
        container="bucket",
        create="gcloud storage buckets create gs://{name}",
        check="check STORAGE_EMULATOR_HOST if you use an emulator",
        permission_hint="run `gcloud auth application-default login` or set "
        "GOOGLE_APPLICATION_CREDENTIALS to a service-account key file; the identity needs "
        "roles/storage.objectUser on the bucket",
        retry_hint="check the network (and STORAGE_EMULATOR_HOST), or raise "
        "RetryPolicy.max_attempts",
    )

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        project: str | None = None,
        chunk_size: int = 32 * MiB,
        timeout_s: tuple[float, float] = (10.0, 60.0),
        retry: RetryPolicy | None = None,
        client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._locate(bucket, prefix, retry, sleep)
        if chunk_size <= 0 or chunk_size % _RESUMABLE_QUANTUM:
            raise ConfigError(
                f"GCS chunk_size {chunk_size} is not a positive multiple of 256 KiB",
                hint="use e.g. chunk_size=32 * 1024 * 1024",
            )
        self.bucket_name = bucket
        self.chunk_size = chunk_size  # objects above 8 MiB go up as resumable uploads of this
        self.timeout = timeout_s  # (connect, read) seconds
        self._client = client or self._connect(project)
        self._bucket = self._client.bucket(bucket)

    def _connect(self, project: str | None) -> Any:
        storage = require("google.cloud.storage", "gcs", "gs:// checkpoint storage")
        return self._call("connect", lambda: storage.Client(project=project))

    def _blob(self, full: str, metadata: dict[str, str] | None = None) -> Any:
        """A handle on one object; with ``metadata``, one to upload (in ``chunk_size`` pieces).
        Downloads stream in one GET, so the client checks GCS's CRC32C of the whole object."""
        if metadata is None:
            return self._bucket.blob(full)
        blob = self._bucket.blob(full, chunk_size=self.chunk_size)
        blob.metadata = metadata
        return blob

    def _upload(self, full: str, data: bytes, generation: int | None = None) -> Any:
        blob = self._blob(full, crc_metadata(data))
        blob.upload_from_string(
            data, retry=None, timeout=self.timeout, checksum="crc32c",
            if_generation_match=generation,
        )  # fmt: skip
        return blob

    def _stat(self, key: str, full: str) -> Any:
        """The object's metadata (generation, size, our CRC32C); missing -> StorageNotFoundError."""
        blob = self._blob(full)
        self._call(f"get {key!r}", lambda: blob.reload(retry=None, timeout=self.timeout))
        return blob

    # -- Storage protocol ------------------------------------------------------------------------
    def put(self, key: str, data: bytes | Path) -> None:
        full = self._full(key)
        if not isinstance(data, Path):
            self._call(f"put {key!r}", lambda: self._upload(full, data))
            return
        with reading_upload(data):
            checksum = file_crc(data)

        def upload() -> None:
            # above 8 MiB the client uploads resumably, chunk_size bytes per request, and checks
            # the CRC32C GCS computed against its own at the end
            blob = self._blob(full, crc_metadata(value=checksum))
            blob.upload_from_filename(
                str(data), retry=None, timeout=self.timeout, checksum="crc32c"
            )

        self._call(f"put {key!r}", upload)

    @overload
    def get(self, key: str, dest: None = None) -> bytes: ...
    @overload
    def get(self, key: str, dest: Path) -> None: ...
    def get(self, key: str, dest: Path | None = None) -> bytes | None:
        full = self._full(key)
        if dest is None:
            return self._call(f"get {key!r}", lambda: self._fetch(key, full))
        self._stat(key, full)  # a missing object fails before any file is made

        def download(out: IO[bytes]) -> int | None:
            blob = self._blob(full)
            blob.reload(retry=None, timeout=self.timeout)
            blob.download_to_file(
                out, retry=None, timeout=self.timeout, checksum="crc32c",
                if_generation_match=blob.generation,
            )  # fmt: skip
            return expected_crc(blob.metadata)

        self._download_whole(key, dest, download)
        return None

    def _fetch(self, key: str, full: str) -> bytes:
        blob = self._blob(full)
        blob.reload(retry=None, timeout=self.timeout)
        data: bytes = blob.download_as_bytes(
            retry=None, timeout=self.timeout, checksum="crc32c",
            if_generation_match=blob.generation,
        )  # fmt: skip
        expected = expected_crc(blob.metadata)
        if expected is not None and crc32c.crc32c(data) != expected:
            raise integrity_error(self.uri, key)
        return data

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        def entries(full: str) -> Iterable[tuple[str, int]]:
            blobs = self._client.list_blobs(
                self._bucket, prefix=full, retry=None, timeout=self.timeout
            )
            return ((b.name, int(b.size or 0)) for b in blobs)

        return self._listing(prefix, entries)

    def delete(self, key: str) -> None:
        self._delete(key, lambda full: self._blob(full).delete(retry=None, timeout=self.timeout))

    # -- compare-and-swap (ObjectLeases) ---------------------------------------------------------
    def put_if(self, key: str, data: bytes, *, etag: str | None) -> str | None:
        """Create ``key`` only if absent (``etag=None``: ``ifGenerationMatch=0``) or replace it
        only if it is still generation ``etag``. Returns the new generation, or None when another
        writer got there first (412)."""
        full = self._full(key)
        generation = 0 if etag is None else int(etag)

        def put() -> str | None:
            try:
                blob = self._upload(full, data, generation)
            except Exception as exc:
                if getattr(exc, "code", None) == 412:
                    return None
                raise
            return str(blob.generation)

        return self._call(f"conditional put {key!r}", put)

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """The object and its generation (for a later ``put_if``), or None if it does not exist."""
        full = self._full(key)

        def fetch() -> tuple[bytes, str] | None:
            blob = self._blob(full)
            try:
                blob.reload(retry=None, timeout=self.timeout)
            except Exception as exc:
                if classify(exc) is Failure.NOT_FOUND:
                    return None
                raise
            data = blob.download_as_bytes(
                retry=None, timeout=self.timeout, checksum="crc32c",
                if_generation_match=blob.generation,
            )  # fmt: skip
            return data, str(blob.generation)

        return self._call(f"get {key!r}", fetch)
