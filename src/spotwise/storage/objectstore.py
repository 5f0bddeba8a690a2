"""What the object-store backends (``s3://``, ``gs://``, ``az://``) share, so each vendor file
holds only its SDK calls and its error table: the CRC32C recorded at upload and checked at
download, the ``scheme://bucket/prefix`` parsing, and the retry loop at the vendor edge (the
vendor SDKs' own retries are off: they cannot resume a body cut mid-stream and would stack
their backoff under ours).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import IO, TypeVar

import crc32c

from spotwise.errors import ConfigError, IntegrityError, StorageError
from spotwise.retry import RetryPolicy
from spotwise.storage.base import validate_key

log = logging.getLogger(__name__)

MiB = 1024 * 1024
CRC_METADATA_KEY = "spotwise-crc32c"  # user metadata on every object: its CRC32C, 8 hex digits

T = TypeVar("T")

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
