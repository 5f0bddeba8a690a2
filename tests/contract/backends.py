"""Factories of every Storage backend that the contract suite runs against.

To add a backend, add one entry: ``name -> factory(request, tmp_path) -> Storage``. A factory
may pull fixtures with ``request.getfixturevalue(...)`` (e.g. ``aws_env`` for the loopback S3
server) and must return an empty store of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from spotwise.storage.base import Storage
from spotwise.storage.crypt import EncryptedStorage
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
}


def _s3(request: pytest.FixtureRequest) -> Storage:
    """A fresh bucket on the loopback moto server; 5 MiB parts so 6 MiB files go multipart."""
    import boto3

    endpoint = request.getfixturevalue("aws_env")
    bucket = f"contract-{uuid.uuid4().hex[:16]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    small = TransferSettings(multipart_threshold=5 << 20, part_size=5 << 20, max_concurrency=4)
    return S3Storage(bucket, "run", transfer=small)
