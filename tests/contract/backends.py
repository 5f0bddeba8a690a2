"""Factories of every Storage backend that the contract suite runs against.

To add a backend, add one entry: ``name -> factory(request, tmp_path) -> Storage``. A factory
may pull fixtures with ``request.getfixturevalue(...)`` (e.g. ``aws_env`` for the loopback S3
server, ``gcs_bucket`` / ``azure_container`` on the loopback GCS and Azure Blob doubles) and must
return an empty store of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from spotwise.retry import RetryPolicy
from spotwise.storage.azureblob import AzureBlobStorage
from spotwise.storage.base import Storage
from spotwise.storage.crypt import EncryptedStorage
from spotwise.storage.gcs import GCSStorage
from spotwise.storage.local import LocalStorage
from spotwise.storage.memory import MemoryStorage
from spotwise.storage.s3 import S3Storage, TransferSettings

Factory = Callable[[pytest.FixtureRequest, Path], Storage]

BACKENDS: dict[str, Factory] = {
    "local": lambda request, tmp_path: LocalStorage(tmp_path / "store"),
    "memory": lambda request, tmp_path: MemoryStorage(f"contract-{uuid.uuid4().hex}"),
    "s3": lambda request, tmp_path: _s3(request),
    "s3+encrypted": lambda request, tmp_path: EncryptedStorage(
        _s3(request), bytes(range(32)), spool_dir=tmp_path / "spool"
    ),
    # 1 MiB chunks/blocks so the 6 MiB file goes up as Azure blocks + a block list; GCS sends
    # files up to 8 MiB in one multipart request (its client's rule), resumable above that
    "gs": lambda request, tmp_path: GCSStorage(
        request.getfixturevalue("gcs_bucket"), "run", chunk_size=1 << 20, retry=_FAST
    ),
    "az": lambda request, tmp_path: AzureBlobStorage(
        request.getfixturevalue("azure_container"), "run", block_size=1 << 20, retry=_FAST
    ),
}
_FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)


def _s3(request: pytest.FixtureRequest) -> Storage:
    """A fresh bucket on the loopback moto server; 5 MiB parts so 6 MiB files go multipart."""
    import boto3

    endpoint = request.getfixturevalue("aws_env")
    bucket = f"contract-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    small = TransferSettings(multipart_threshold=5 << 20, part_size=5 << 20, max_concurrency=4)
    return S3Storage(bucket, "run", transfer=small)
