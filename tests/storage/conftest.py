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


@pytest.fixture(params=["s3", "gcs", "azureblob"])
def object_store(request: pytest.FixtureRequest) -> Any:
    """An empty prefix on each object store's loopback double (moto, GCS, Azure Blob), for the
    checkpoint-layer tests that must hold on all three."""
    if request.param == "s3":
        return request.getfixturevalue("make_s3")()
    if request.param == "gcs":
        from spotwise.storage.gcs import GCSStorage

        bucket = request.getfixturevalue("gcs_bucket")
        return GCSStorage(bucket, "run", chunk_size=MiB, retry=FAST_RETRY)
    from spotwise.storage.azureblob import AzureBlobStorage

    container = request.getfixturevalue("azure_container")
    return AzureBlobStorage(container, "run", block_size=MiB, retry=FAST_RETRY)


@pytest.fixture()
def proxy(aws_env: str) -> Iterator[FaultProxy]:
    fault_proxy = FaultProxy(aws_env)
    try:
        yield fault_proxy
    finally:
        fault_proxy.close()
