"""Storage test fixtures: unique buckets on the loopback moto server, the fault proxy."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from spotwise.storage.s3 import MiB, RetryPolicy, S3Storage, TransferSettings

from .fault_proxy import FaultProxy

# Small parts so multipart paths run on a few MiB; tiny backoff so retries cost milliseconds.
SMALL_TRANSFER = TransferSettings(multipart_threshold=5 * MiB, part_size=5 * MiB, max_concurrency=4)
FAST_RETRY = RetryPolicy(max_attempts=4, base_delay_s=0.01, max_delay_s=0.05)


@pytest.fixture()
def s3_client(aws_env: str) -> Any:
    import boto3

    return boto3.client("s3", endpoint_url=aws_env)


@pytest.fixture()
def bucket(s3_client: Any) -> str:
    name = f"spotwise-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=name)
    return name


@pytest.fixture()
def make_s3(aws_env: str, bucket: str) -> Callable[..., S3Storage]:
    """Build an S3Storage on the test bucket; keyword options override the fast test defaults."""

    def make(prefix: str = "run", **options: Any) -> S3Storage:
        options.setdefault("transfer", SMALL_TRANSFER)
        options.setdefault("retry", FAST_RETRY)
        return S3Storage(bucket, prefix, **options)

    return make


@pytest.fixture()
def proxy(aws_env: str) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(aws_env)
    try:
        yield fault_proxy
    finally:
        fault_proxy.close()
