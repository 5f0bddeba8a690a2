"""What the object-store backends (``s3://``, ``gs://``, ``az://``) share, so each vendor file
holds only its SDK calls and its error table: the CRC32C recorded at upload and checked at
download, the ``scheme://bucket/prefix`` location and its keys (:class:`BucketStore`), and the
retry loop at the vendor edge with the translation of its last failure (the vendor SDKs' own
retries are off: they cannot resume a body cut mid-stream and would stack their backoff under
ours).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, Any, ClassVar, TypeVar

import crc32c

from spotwise.checkpoint.durable import write_atomic
from spotwise.errors import (
    ConfigError,
    IntegrityError,
    StorageError,
    StorageNotFoundError,
    StoragePermissionError,
    TransientStorageError,
)
from spotwise.retry import RetryPolicy
from spotwise.storage.base import ObjectInfo, validate_key

log = logging.getLogger(__name__)

MiB = 1024 * 1024
CRC_METADATA_KEY = "spotwise-crc32c"  # user metadata on every object: its CRC32C, 8 hex digits

T = TypeVar("T")
B = TypeVar("B", bound="BucketStore")

# Exception class names (anywhere in the MRO) raised while a request or its body is on the wire,
# by botocore, requests, urllib3, azure-core or the socket layer: retrying them is safe.
NETWORK_ERRORS = frozenset(
    {
        "ConnectionError", "HTTPClientError", "ReadTimeoutError", "ConnectTimeoutError",
        "ConnectionClosedError", "EndpointConnectionError", "IncompleteReadError",
        "ResponseStreamingError", "ProtocolError", "ReadTimeout", "ConnectTimeout", "Timeout",
        "ConnectionResetError", "BrokenPipeError", "TimeoutError", "IncompleteRead",
        "RemoteDisconnected", "ChunkedEncodingError", "ServiceRequestError",
        "ServiceResponseError",
    }
)  # fmt: skip


def is_network_error(exc: BaseException) -> bool:
    return not {cls.__name__ for cls in type(exc).__mro__}.isdisjoint(NETWORK_ERRORS)


class Failure(Enum):
    """What a vendor exception means for the caller (decided by each backend's ``classify``)."""

    RETRY = "retry"
    NOT_FOUND = "not_found"
    NO_BUCKET = "no_bucket"
    PERMISSION = "permission"
    CORRUPT = "corrupt"  # the bytes on the wire failed the vendor's checksum: retried, then fatal
    FATAL = "fatal"


def parse_bucket_uri(uri: str, scheme: str, container: str = "bucket") -> tuple[str, str]:
    """``scheme://bucket/some/prefix`` -> ("bucket", "some/prefix")."""
    example = f"{scheme}://{container}/prefix"
    if not uri.startswith(f"{scheme}://"):
        raise ConfigError(f"not a {scheme}:// URI: {uri!r}", hint=f"use {example}")
    bucket, _, prefix = uri[len(scheme) + 3 :].partition("/")
    if not bucket:
        raise ConfigError(f"URI {uri!r} has no {container}", hint=f"use {example}")
    prefix = prefix.strip("/")
    if prefix:
        validate_key(prefix)
    return bucket, prefix


def check_prefix(prefix: str) -> None:
    """A listing prefix may end anywhere (``step-000001``) but must not climb or be absolute."""
    if prefix and (
        prefix.startswith("/") or "\\" in prefix or any(p in (".", "..") for p in prefix.split("/"))
    ):
        raise ConfigError(
            f"invalid listing prefix {prefix!r}",
            hint="use a relative prefix such as 'step-00000100/'",
        )


def crc_hex(value: int) -> str:
    return f"{value:08x}"


def crc_metadata(data: bytes | None = None, *, value: int | None = None) -> dict[str, str]:
    """The user metadata that records an object's CRC32C (of ``data``, or a known ``value``)."""
    checksum = value if value is not None else crc32c.crc32c(data or b"")
    return {CRC_METADATA_KEY: crc_hex(checksum)}


def expected_crc(metadata: Mapping[str, str] | None) -> int | None:
    value = (metadata or {}).get(CRC_METADATA_KEY)
    return int(value, 16) if value else None


@contextmanager
def reading_upload(source: Path) -> Iterator[None]:
    """Reads of a file about to be uploaded: a missing one fails as StorageNotFoundError
    naming it, in every backend alike."""
    try:
        yield
    except FileNotFoundError as exc:
        raise StorageNotFoundError(f"cannot upload {source}: no such file") from exc


def file_crc(path: Path) -> int:
    with open(path, "rb") as fh:
        return stream_crc(fh)


def stream_crc(fh: IO[bytes]) -> int:
    value = 0
    while chunk := fh.read(8 * MiB):
        value = crc32c.crc32c(chunk, value)
    return value


def integrity_error(uri: str, key: str) -> IntegrityError:
    return IntegrityError(
        f"{uri}/{key}: downloaded bytes do not match the CRC32C recorded at upload",
        hint="the stored object is corrupt or was overwritten by another tool; use an older "
        "checkpoint",
    )


@dataclass
class Edge:
    """The retry loop every vendor call goes through: transient failures (as ``classify`` says)
    wait by ``RetryPolicy``; the last failure becomes a spotwise error through ``translate``."""

    classify: Callable[[BaseException], Failure]
    translate: Callable[[str, BaseException, Failure, int], Exception]
    policy: RetryPolicy
    sleep: Callable[[float], None] = time.sleep
    retries: int = 0
    _rand: random.Random = field(default_factory=random.Random, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def call(self, what: str, fn: Callable[[], T]) -> T:
        attempt = 1
        while True:
            try:
                return fn()
            except StorageError:
                raise
            except Exception as exc:  # vendor errors are translated right here, at the edge
                kind = self.classify(exc)
                retry = kind in (Failure.RETRY, Failure.CORRUPT)
                if retry and attempt < self.policy.max_attempts:
                    delay = self.policy.delay_s(attempt, self._rand.random())
                    log.info("%s failed (%s), retry %d in %.2fs", what, brief(exc), attempt, delay)
                    with self._lock:
                        self.retries += 1
                    self.sleep(delay)
                    attempt += 1
                    continue
                raise self.translate(what, exc, kind, attempt) from exc


def brief(exc: BaseException) -> str:
    """One line about a vendor exception, without request headers (they carry credentials)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:300]}"


@dataclass(frozen=True)
class ErrorTable:
    """One vendor's failures: what each exception means (``classify``) and how the final one
    reads, with the fix in that vendor's words."""

    classify: Callable[[BaseException], Failure]
    vendor: str  # "S3", "GCS", "Azure"
    container: str  # the vendor's word for a bucket
    create: str  # the command that makes one; "{name}" is its name
    check: str  # what else to check when it is missing
    permission_hint: str
    retry_hint: str  # after "the store is throttling, erroring or unreachable; "
    brief: Callable[[BaseException], str] = brief


class BucketStore:
    """What every object-store backend does that is no SDK call: its ``scheme://name/prefix``
    location, keys under the prefix, the retry edge and the translation of the last failure
    through the backend's :class:`ErrorTable`."""

    scheme: ClassVar[str]
    errors: ClassVar[ErrorTable]
    prefix: str
    uri: str
    retry: RetryPolicy
    _edge: Edge

    def _locate(
        self, name: str, prefix: str, retry: RetryPolicy | None, sleep: Callable[[float], None]
    ) -> None:
        """Check and keep the location; set up the retry edge."""
        noun = self.errors.container
        if not name or "/" in name:
            raise ConfigError(
                f"invalid {self.errors.vendor} {noun} name {name!r}",
                hint=f"use {self.scheme}://{noun}/prefix",
            )
        self._name = name
        self.prefix = prefix.strip("/")
        if self.prefix:
            validate_key(self.prefix)
        where = f"{self.scheme}://{name}"
        self.uri = f"{where}/{self.prefix}" if self.prefix else where
        self.retry = retry or RetryPolicy.from_env()
        self._edge = Edge(self.errors.classify, self._translate, self.retry, sleep)

    @classmethod
    def from_uri(cls: type[B], uri: str, **options: Any) -> B:
        name, prefix = parse_bucket_uri(uri, cls.scheme, cls.errors.container)
        return cls(name, prefix, **options)  # type: ignore[call-arg]

    @property
    def _root(self) -> str:
        """The prefix as the start of a full key ("" at the bucket's root)."""
        return f"{self.prefix}/" if self.prefix else ""

    def _full(self, key: str) -> str:
        validate_key(key)
        return self._root + key

    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` with retries on transient failures; translate the final failure."""
        return self._edge.call(what, fn)

    def _listing(
        self, prefix: str, entries: Callable[[str], Iterable[tuple[str, int]]]
    ) -> list[ObjectInfo]:
        """The objects under ``prefix``, sorted; ``entries(full_prefix)`` yields the vendor's
        (full key, size) pairs."""
        check_prefix(prefix)
        root = self._root

        def collect() -> list[ObjectInfo]:
            return [ObjectInfo(name[len(root) :], size) for name, size in entries(root + prefix)]

        return sorted(self._call(f"list {prefix!r}", collect), key=lambda o: o.key)

    def _delete(self, key: str, remove: Callable[[str], None]) -> None:
        """``remove(full key)``, where an object already gone is no error (a missing bucket is)."""
        full = self._full(key)

        def attempt() -> None:
            try:
                remove(full)
            except Exception as exc:
                if self.errors.classify(exc) is not Failure.NOT_FOUND:
                    raise

        self._call(f"delete {key!r}", attempt)

    def _download_whole(
        self, key: str, dest: Path, download: Callable[[IO[bytes]], int | None]
    ) -> None:
        """Fill ``dest`` atomically by ``download(out)`` (which returns the CRC32C recorded at
        upload, or None), retried from the start, then checked; the object is known to exist."""
        dest.parent.mkdir(parents=True, exist_ok=True)

        def fill(out: IO[bytes]) -> None:
            def fetch() -> int | None:
                out.seek(0)
                out.truncate()
                return download(out)

            expected = self._call(f"get {key!r}", fetch)
            out.flush()
            out.seek(0)
            if expected is not None and stream_crc(out) != expected:
                raise integrity_error(self.uri, key)

        write_atomic(dest, fill)

    def _translate(self, what: str, exc: BaseException, kind: Failure, attempts: int) -> Exception:
        table, where = self.errors, f"{what} at {self.uri}"
        if kind is Failure.NO_BUCKET:
            return StorageNotFoundError(
                f"{table.vendor} {table.container} {self._name!r} does not exist ({where})",
                hint=f"create it ({table.create.format(name=self._name)}) or fix the "
                f"{table.container} in the URI; {table.check}",
            )
        if kind is Failure.NOT_FOUND:
            return StorageNotFoundError(f"not found: {where}")
        if kind is Failure.PERMISSION:
            return StoragePermissionError(
                f"{table.vendor} refused access: {where} ({table.brief(exc)})",
                hint=table.permission_hint,
            )
        if kind is Failure.CORRUPT:
            return IntegrityError(
                f"{where}: the bytes received failed {table.vendor}'s CRC32C on every one of "
                f"{attempts} attempts",
                hint="the stored object is corrupt; use an older checkpoint",
            )
        if kind is Failure.RETRY:
            return TransientStorageError(
                f"{where} still failing after {attempts} attempts ({table.brief(exc)})",
                hint=f"the store is throttling, erroring or unreachable; {table.retry_hint}",
            )
        return StorageError(f"{where} failed: {table.brief(exc)}")

    @property
    def retries(self) -> int:
        """How many times a call was retried (for benchmarks and tests)."""
        return self._edge.retries
