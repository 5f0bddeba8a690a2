"""Both lease boards grant a shard to one holder at a time, hand it over only after expiry,
refuse renewals of a lost lease and never lease a finished shard again (same scenario, real
SQLite file and real conditional writes: S3 on the loopback moto server, GCS generations and
Azure ETags on their loopback doubles through the official clients)."""

from __future__ import annotations

import uuid

import boto3
import pytest

from spotwise.batch import ObjectLeases, SQLiteLeases
from spotwise.storage.azureblob import AzureBlobStorage
from spotwise.storage.gcs import GCSStorage
from spotwise.storage.s3 import S3Storage


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _object_store(request, kind: str, prefix: str):
    if kind == "gcs":
        return GCSStorage(request.getfixturevalue("gcs_bucket"), prefix)
    if kind == "azureblob":
        return AzureBlobStorage(request.getfixturevalue("azure_container"), prefix)
    endpoint = request.getfixturevalue("aws_env")
    bucket = f"leases-{uuid.uuid4().hex[:8]}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
    return S3Storage(bucket, prefix, endpoint_url=endpoint)


@pytest.fixture(params=["sqlite", "s3", "gcs", "azureblob"])
def board(request, tmp_path):
    clock = Clock()
    if request.param == "sqlite":
        yield SQLiteLeases(tmp_path / "leases.db", clock=clock), clock
        return
    yield ObjectLeases(_object_store(request, request.param, "job/leases"), clock=clock), clock


def test_one_holder_at_a_time_and_handover_after_expiry(board):
    leases, clock = board
    a = leases.claim("a", [0, 1], ttl_s=10)
    assert a is not None and a.key == 0
    b = leases.claim("b", [0, 1], ttl_s=10)
    assert b is not None and b.key == 1, "a live lease is never granted twice"
    assert leases.claim("c", [0, 1], ttl_s=10) is None
    clock.now += 5
    a = leases.renew(a, ttl_s=10)  # a keeps renewing: live until 1015
    assert a is not None
    clock.now += 6  # b (until 1010) expired without renewing: its worker died
    c = leases.claim("c", [0, 1], ttl_s=10)
    assert c is not None and c.key == 1 and c.token != b.token
    assert leases.renew(b, ttl_s=10) is None, "the dead holder's lease is lost"
    assert leases.renew(c, ttl_s=10) is not None


def test_finished_shards_are_never_leased_again(board):
    leases, clock = board
    a = leases.claim("a", [3], ttl_s=1)
    leases.finish(a)
    clock.now += 100
    assert leases.claim("b", [3], ttl_s=1) is None


def test_a_released_lease_is_claimable_at_once(board):
    leases, _ = board
    a = leases.claim("a", [7], ttl_s=60)
    assert leases.claim("b", [7], ttl_s=60) is None
    leases.renew(a, ttl_s=0.0)  # what a worker does on a notice: hand the shard back now
    assert leases.claim("b", [7], ttl_s=60) is not None


@pytest.mark.parametrize("kind", ["s3", "gcs", "azureblob"])
def test_the_object_store_refuses_a_second_create(kind, request):
    """The primitive ObjectLeases relies on: If-None-Match: * and If-Match (moto, Azure),
    ifGenerationMatch=0 and ifGenerationMatch=<generation> (GCS)."""
    store = _object_store(request, kind, "")
    first = store.put_if("k", b"1", etag=None)
    assert first is not None
    assert store.put_if("k", b"2", etag=None) is None
    second = store.put_if("k", b"3", etag=first)
    assert second is not None and store.put_if("k", b"4", etag=first) is None
    assert store.get_tagged("k") == (b"3", second)
    assert store.get_tagged("missing") is None


def test_a_reopened_shard_is_leasable_again(board):
    leases, _ = board
    leases.finish(leases.claim("a", [2], ttl_s=5))
    assert leases.claim("b", [2], ttl_s=5) is None
    leases.reopen(2)
    assert leases.claim("b", [2], ttl_s=5) is not None
