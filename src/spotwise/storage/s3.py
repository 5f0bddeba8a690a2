"""S3 and S3-compatible object stores (MinIO, Ceph RGW, R2, GCS XML API) through boto3.

Why our own transfer loop instead of boto3's ``upload_file``: we need a CRC32C of every object
recorded at upload and checked at download, retries that also cover a body cut off mid-stream
(botocore only retries whole requests), a clean abort of a multipart upload that failed, and
vendor errors translated into spotwise's exception tree with a hint.

Credentials and endpoint come the AWS way (env vars, profiles, ``AWS_ENDPOINT_URL`` /
``AWS_ENDPOINT_URL_S3``, handled by botocore); boto3 is imported only when a backend is built.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar, overload

import crc32c

from spotwise.checkpoint.durable import write_atomic
from spotwise.errors import (
    ConfigError,
    StorageError,
)
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
    parse_bucket_uri,
    reading_upload,
    stream_crc,
)

log = logging.getLogger(__name__)

# The CRC32C goes into user metadata as x-amz-meta-spotwise-crc32c (objectstore.CRC_METADATA_KEY).
_MAX_PARTS = 10_000  # S3's limit on parts per multipart upload
_MIN_PART = 5 * MiB  # S3's minimum size of every part but the last
_READ_CHUNK = 1 * MiB

T = TypeVar("T")


# --- pure decisions ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TransferSettings:
    """Sizes for large objects: above the threshold, parts go up/down in parallel."""

    multipart_threshold: int = 64 * MiB
    part_size: int = 32 * MiB
    max_concurrency: int = 8

    def __post_init__(self) -> None:
        if self.part_size < _MIN_PART:
            raise ConfigError(
                f"S3 part size {self.part_size} is below S3's minimum of 5 MiB",
                hint="use part_size >= 5 * 1024 * 1024",
            )
        if self.max_concurrency < 1:
            raise ConfigError("max_concurrency must be >= 1", hint="use 1 for sequential transfers")


def plan_parts(size: int, part_size: int) -> list[tuple[int, int]]:
    """Split ``size`` bytes into (offset, length) parts, growing parts to stay under 10000."""
    if size <= 0:
        return []
    part = max(part_size, -(-size // _MAX_PARTS))
    return [(off, min(part, size - off)) for off in range(0, size, part)]


_RETRY_CODES = frozenset(
    {
        "SlowDown", "Throttling", "ThrottlingException", "RequestThrottled", "TooManyRequests",
        "RequestLimitExceeded", "ServiceUnavailable", "InternalError", "RequestTimeout",
        "RequestTimeoutException", "PriorRequestNotComplete", "BadDigest", "IncompleteBody",
    }
)  # fmt: skip
_PERMISSION_CODES = frozenset(
    {
        "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
        "InvalidToken", "TokenRefreshRequired", "AllAccessDisabled", "AccountProblem",
        "InvalidClientTokenId", "UnrecognizedClientException",
    }
)  # fmt: skip
_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404", "NoSuchUpload"})


def classify(exc: BaseException) -> Failure:
    """What to do about an exception from botocore/urllib3/socket (pure; no retries here)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        error = response.get("Error", {}) or {}
        code = str(error.get("Code", ""))
        status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if code == "NoSuchBucket":
            return Failure.NO_BUCKET
        if code in _PERMISSION_CODES or status in (401, 403):
            return Failure.PERMISSION
        if code in _NOT_FOUND_CODES or status == 404:
            return Failure.NOT_FOUND
        if code in _RETRY_CODES or status in (429, 500, 502, 503, 504):
            return Failure.RETRY
        return Failure.FATAL
    names = {cls.__name__ for cls in type(exc).__mro__}
    if "NoCredentialsError" in names or "PartialCredentialsError" in names:
        return Failure.PERMISSION
    if is_network_error(exc):
        return Failure.RETRY
    return Failure.FATAL


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix")."""
    return parse_bucket_uri(uri, "s3")


def _brief(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict) and response.get("Error"):
        error = response["Error"]
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{error.get('Code')} {status}: {error.get('Message', '')}".strip()
    return f"{type(exc).__name__}: {exc}"


# --- the backend -------------------------------------------------------------------------------
class S3Storage(BucketStore):
    """A key space under ``s3://bucket/prefix``; implements the ``Storage`` protocol."""

    scheme = "s3"
    errors = ErrorTable(
        classify,
        vendor="S3",
        container="bucket",
        create="aws s3 mb s3://{name}",
        check="check AWS_ENDPOINT_URL if you use an S3-compatible store",
        permission_hint="check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE and that "
        "the identity may read and write this bucket and prefix",
        retry_hint="check the endpoint (AWS_ENDPOINT_URL) and network, or raise "
        "RetryPolicy.max_attempts",
        brief=_brief,
    )

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        profile: str | None = None,
        addressing_style: str | None = None,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        transfer: TransferSettings | None = None,
        retry: RetryPolicy | None = None,
        client: Any = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._locate(bucket, prefix, retry, sleep)
        self.bucket = bucket
        self.transfer = transfer or TransferSettings()
        self._client = client or self._make_client(
            endpoint_url, region, profile, addressing_style, connect_timeout_s, read_timeout_s
        )

    def _make_client(
        self,
        endpoint_url: str | None,
        region: str | None,
        profile: str | None,
        addressing_style: str | None,
        connect_timeout_s: float,
        read_timeout_s: float,
    ) -> Any:
        boto3 = require("boto3", "s3", "S3 checkpoint storage")
        botocore_config = require("botocore.config", "s3", "S3 checkpoint storage")
        botocore_exceptions = require("botocore.exceptions", "s3", "S3 checkpoint storage")
        s3_options = {"addressing_style": addressing_style} if addressing_style else {}
        config = botocore_config.Config(
            # Retries are ours (see RetryPolicy): botocore cannot retry a body cut mid-stream.
            retries={"total_max_attempts": 1},
            max_pool_connections=max(10, 2 * self.transfer.max_concurrency),
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            s3=s3_options or None,
        )
        try:
            session = boto3.session.Session(profile_name=profile)
            return session.client(
                "s3", endpoint_url=endpoint_url, region_name=region, config=config
            )
        except botocore_exceptions.ProfileNotFound as exc:
            raise ConfigError(
                f"AWS profile {profile or os.environ.get('AWS_PROFILE')!r} not found",
                hint="check AWS_PROFILE / ~/.aws/config, or use AWS_ACCESS_KEY_ID etc.",
            ) from exc
        except ValueError as exc:  # botocore rejects a malformed endpoint URL with ValueError
            raise ConfigError(
                f"invalid S3 endpoint: {exc}",
                hint="AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 must look like https://host:port",
            ) from exc

    # -- compare-and-swap (ObjectLeases) ---------------------------------------------------------
    def put_if(self, key: str, data: bytes, *, etag: str | None) -> str | None:
        """Conditional put, the object store's compare-and-swap: create ``key`` only if it is
        absent (``etag=None``: ``If-None-Match: *``) or replace it only if it still has ``etag``
        (``If-Match``). Returns the new ETag, or None when another writer got there first."""
        full = self._full(key)
        condition = {"IfNoneMatch": "*"} if etag is None else {"IfMatch": etag}
        metadata = crc_metadata(data)

        def put() -> str | None:
            try:
                response = self._client.put_object(
                    Bucket=self.bucket, Key=full, Body=data, Metadata=metadata, **condition
                )
            except Exception as exc:
                if _lost_race(exc):
                    return None
                raise
            return str(response["ETag"])

        return self._call(f"conditional put {key!r}", put)

    def get_tagged(self, key: str) -> tuple[bytes, str] | None:
        """The object and its ETag (for a later ``put_if``), or None if it does not exist."""
        full = self._full(key)

        def fetch() -> tuple[bytes, str] | None:
            try:
                response = self._client.get_object(Bucket=self.bucket, Key=full)
            except Exception as exc:
                if classify(exc) is Failure.NOT_FOUND:
                    return None
                raise
            return response["Body"].read(), str(response["ETag"])

        return self._call(f"get {key!r}", fetch)

    # -- Storage protocol ------------------------------------------------------------------------
    def put(self, key: str, data: bytes | Path) -> None:
        full = self._full(key)
        if isinstance(data, Path):
            source = data
            with reading_upload(source):
                size = source.stat().st_size
                if size >= self.transfer.multipart_threshold:
                    checksum = file_crc(source)
                else:  # one PUT: read once, its CRC32C taken from the bytes below
                    data = source.read_bytes()
            if isinstance(data, Path):
                self._multipart_upload(key, full, source, size, crc_metadata(value=checksum))
                return
        body, metadata = data, crc_metadata(data)
        self._call(
            f"put {key!r}",
            lambda: self._client.put_object(
                Bucket=self.bucket, Key=full, Body=body, Metadata=metadata
            ),
        )

    def _part_checksum_args(self) -> dict[str, str]:
        """Per-part CRC32 checked by the store on receipt, as boto3's transfer manager asks for
        unless the client is configured with request_checksum_calculation=when_required (for
        stores that reject flexible checksums). Without it, a store may instead compute a
        full-object checksum at completion."""
        setting = getattr(self._client.meta.config, "request_checksum_calculation", None)
        return {"ChecksumAlgorithm": "CRC32"} if setting == "when_supported" else {}

    def _multipart_upload(
        self, key: str, full: str, source: Path, size: int, metadata: dict[str, str]
    ) -> None:
        checksum_args = self._part_checksum_args()
        created = self._call(
            f"start upload of {key!r}",
            lambda: self._client.create_multipart_upload(
                Bucket=self.bucket, Key=full, Metadata=metadata, **checksum_args
            ),
        )
        upload_id = created["UploadId"]
        try:
            with open(source, "rb") as fh:
                fd = fh.fileno()

                def send(number: int, offset: int, length: int) -> dict[str, Any]:
                    body = os.pread(fd, length, offset)
                    result = self._call(
                        f"upload part {number} of {key!r}",
                        lambda: self._client.upload_part(
                            Bucket=self.bucket, Key=full, UploadId=upload_id,
                            PartNumber=number, Body=body, **checksum_args,
                        ),
                    )  # fmt: skip
                    part = {"PartNumber": number, "ETag": result["ETag"]}
                    if "ChecksumCRC32" in result:
                        part["ChecksumCRC32"] = result["ChecksumCRC32"]
                    return part

                jobs = [
                    (n, off, length)
                    for n, (off, length) in enumerate(plan_parts(size, self.transfer.part_size), 1)
                ]
                parts = self._parallel(send, jobs)
            self._call(
                f"complete upload of {key!r}",
                lambda: self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=full, UploadId=upload_id,
                    MultipartUpload={"Parts": sorted(parts, key=lambda p: p["PartNumber"])},
                ),
            )  # fmt: skip
        except BaseException:
            self._abort(full, upload_id)
            raise

    def _abort(self, full: str, upload_id: str) -> None:
        """Abort so no incomplete upload lingers (and keeps costing storage)."""
        try:
            self._call(
                f"abort upload {upload_id}",
                lambda: self._client.abort_multipart_upload(
                    Bucket=self.bucket, Key=full, UploadId=upload_id
                ),
            )
        except StorageError as exc:
            log.warning(
                "could not abort multipart upload %s of s3://%s/%s: %s; a bucket lifecycle rule "
                "AbortIncompleteMultipartUpload (or abort_incomplete_uploads()) will clean it",
                upload_id, self.bucket, full, exc,
            )  # fmt: skip

    def _parallel(self, fn: Callable[..., T], jobs: list[tuple[int, int, int]]) -> list[T]:
        """Run jobs on a bounded pool; the first failure cancels what has not started."""
        workers = min(self.transfer.max_concurrency, len(jobs)) or 1
        with ThreadPoolExecutor(workers, thread_name_prefix="spotwise-s3") as pool:
            futures = [pool.submit(fn, *job) for job in jobs]
            done, pending = wait(futures, return_when=FIRST_EXCEPTION)
            for fut in pending:
                fut.cancel()
            for fut in done:
                if fut.exception() is not None:
                    raise fut.exception()  # type: ignore[misc]
            return [fut.result() for fut in futures]

    def _head(self, key: str, full: str) -> tuple[int, int | None]:
        head = self._call(
            f"get {key!r}", lambda: self._client.head_object(Bucket=self.bucket, Key=full)
        )
        return int(head["ContentLength"]), expected_crc(head.get("Metadata"))

    @overload
    def get(self, key: str, dest: None = None) -> bytes: ...
    @overload
    def get(self, key: str, dest: Path) -> None: ...
    def get(self, key: str, dest: Path | None = None) -> bytes | None:
        full = self._full(key)
        if dest is None:
            return self._fetch(key, full)
        size, expected = self._head(key, full)
        dest.parent.mkdir(parents=True, exist_ok=True)

        def fill(out: IO[bytes]) -> None:
            out.truncate(size)
            fd = out.fileno()
            ranges = plan_parts(size, self.transfer.part_size)
            if size < self.transfer.multipart_threshold:
                ranges = [(0, size)] if size else []

            def fetch(number: int, offset: int, length: int) -> None:
                self._download_range(key, full, fd, offset, length)

            self._parallel(fetch, [(n, off, ln) for n, (off, ln) in enumerate(ranges, 1)])
            out.seek(0)
            if expected is not None and stream_crc(out) != expected:
                raise integrity_error(self.uri, key)

        write_atomic(dest, fill)
        return None

    def _fetch(self, key: str, full: str) -> bytes:
        """The whole object in one GET, checked against the CRC32C recorded at upload."""

        def fetch() -> tuple[bytes, int | None]:
            response = self._client.get_object(Bucket=self.bucket, Key=full)
            return response["Body"].read(), expected_crc(response.get("Metadata"))

        data, expected = self._call(f"get {key!r}", fetch)
        if expected is not None and crc32c.crc32c(data) != expected:
            raise integrity_error(self.uri, key)
        return data

    def _download_range(self, key: str, full: str, fd: int, offset: int, length: int) -> None:
        """Stream one byte range into the file; a cut-off body resumes where it stopped."""
        position = offset
        end = offset + length

        def stream() -> None:
            nonlocal position
            response = self._client.get_object(
                Bucket=self.bucket, Key=full, Range=f"bytes={position}-{end - 1}"
            )
            for chunk in _iter_body(response["Body"]):
                os.pwrite(fd, chunk, position)
                position += len(chunk)
            if position != end:
                raise _ShortBody(f"got {position - offset} of {length} bytes")

        self._call(f"get {key!r} bytes {offset}-{end - 1}", stream)

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        def entries(full: str) -> Iterable[tuple[str, int]]:
            paginator = self._client.get_paginator("list_objects_v2")
            return [
                (obj["Key"], int(obj["Size"]))
                for page in paginator.paginate(Bucket=self.bucket, Prefix=full)
                for obj in page.get("Contents", [])
            ]

        return self._listing(prefix, entries)

    def delete(self, key: str) -> None:
        full = self._full(key)
        self._call(
            f"delete {key!r}", lambda: self._client.delete_object(Bucket=self.bucket, Key=full)
        )

    # -- housekeeping ----------------------------------------------------------------------------
    def abort_incomplete_uploads(self, older_than_s: float = 24 * 3600.0) -> int:
        """Abort multipart uploads under our prefix left by a killed process; returns the count.

        Only uploads older than ``older_than_s`` are touched, so a live writer elsewhere is safe.
        """
        root = self._root
        listing = self._call(
            "list incomplete uploads",
            lambda: self._client.list_multipart_uploads(Bucket=self.bucket, Prefix=root),
        )
        cutoff = time.time() - older_than_s
        aborted = 0
        for upload in listing.get("Uploads", []):
            if upload["Initiated"].timestamp() <= cutoff:
                self._abort(upload["Key"], upload["UploadId"])
                aborted += 1
        return aborted


class _ShortBody(ConnectionError):
    """The server closed a body early without an error; retried like a reset."""


def _iter_body(body: Any) -> Iterator[bytes]:
    while True:
        chunk = body.read(_READ_CHUNK)
        if not chunk:
            return
        yield chunk


def _lost_race(exc: BaseException) -> bool:
    """A conditional write refused because the object changed (412), or a concurrent conditional
    write to the same key (409 ConditionalRequestConflict)."""
    response = getattr(exc, "response", None)
    if not isinstance(response, dict):
        return False
    code = str((response.get("Error") or {}).get("Code", ""))
    status = int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412)
