"""Faults on the wire between boto3 and the store, injected by the loopback fault proxy."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from spotwise.errors import StoragePermissionError, TransientStorageError
from spotwise.storage.s3 import MiB, S3Storage

from .conftest import FAST_RETRY, SMALL_TRANSFER
from .fault_proxy import Fault, FaultProxy


@pytest.fixture()
def via_proxy(proxy: FaultProxy, bucket: str):
    def make(**options: Any) -> S3Storage:
        options.setdefault("transfer", SMALL_TRANSFER)
        options.setdefault("retry", FAST_RETRY)
        return S3Storage(bucket, "run", endpoint_url=proxy.url, **options)

    return make


def _big(tmp_path: Path, size: int = 11 * MiB) -> Path:
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(size))
    return src


@pytest.mark.parametrize(
    ("status", "code"), [(503, "SlowDown"), (500, "InternalError"), (503, "ServiceUnavailable")]
)
def test_put_retries_throttling_and_5xx(via_proxy, proxy: FaultProxy, status: int, code: str):
    store = via_proxy()
    proxy.add(Fault("status", method="PUT", status=status, code=code, times=2))
    store.put("k", b"hello")
    assert proxy.count("PUT", "/run/k") == 3
    assert store.retries == 2
    assert store.get("k") == b"hello"


def test_multipart_part_failures_and_reset_are_retried(via_proxy, proxy, tmp_path, s3_client,
                                                       bucket):  # fmt: skip
    store = via_proxy()
    src = _big(tmp_path)
    proxy.add(Fault("status", method="PUT", query_contains="partNumber=2", status=500,
                    code="InternalError", times=2))  # fmt: skip
    proxy.add(Fault("reset", method="PUT", query_contains="partNumber=3"))
    store.put("big.bin", src)
    assert proxy.count("PUT", query_contains="partNumber=2") == 3
    assert proxy.count("PUT", query_contains="partNumber=3") == 2
    store.get("big.bin", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == src.read_bytes()
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_stalled_part_times_out_and_is_retried(via_proxy, proxy, tmp_path):
    # a 4 s read timeout that a loaded moto still answers within, and a part that stalls 12 s
    store = via_proxy(read_timeout_s=4.0)
    src = _big(tmp_path)
    proxy.add(Fault("stall", method="PUT", query_contains="partNumber=1", stall_s=12.0))
    store.put("big.bin", src)
    assert proxy.count("PUT", query_contains="partNumber=1") == 2
    store.get("big.bin", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == src.read_bytes()


def test_download_body_cut_midway_resumes(via_proxy, proxy, tmp_path):
    store = via_proxy()
    src = _big(tmp_path)
    store.put("big.bin", src)
    store.put("small", b"x" * 100_000)
    proxy.add(Fault("cut_body", method="GET", path_contains="/run/big.bin", times=2))
    proxy.add(Fault("reset", method="GET", path_contains="/run/small"))
    store.get("big.bin", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == src.read_bytes()
    assert store.get("small") == b"x" * 100_000
    assert store.retries == 3


def test_persistent_failure_aborts_multipart_and_leaves_nothing(via_proxy, proxy, tmp_path,
                                                                 s3_client, bucket):  # fmt: skip
    store = via_proxy()
    store.put("big.bin", b"previous version")
    proxy.add(Fault("status", method="PUT", query_contains="partNumber=2", times=100))
    with pytest.raises(TransientStorageError, match="after 4 attempts") as err:
        store.put("big.bin", _big(tmp_path))
    assert "AWS_ENDPOINT_URL" in str(err.value)
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    assert proxy.count("DELETE", query_contains="uploadId=") >= 1
    assert store.get("big.bin") == b"previous version"  # the old object is untouched


def test_bad_credentials_fail_fast_with_a_hint(proxy: FaultProxy, bucket: str, monkeypatch):
    proxy.require_access_key = "testing"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "wrong-key")
    store = S3Storage(bucket, "run", endpoint_url=proxy.url, retry=FAST_RETRY)
    with pytest.raises(StoragePermissionError, match="InvalidAccessKeyId") as err:
        store.put("k", b"x")
    assert "AWS_ACCESS_KEY_ID" in str(err.value)
    assert "wrong-key" not in str(err.value)  # never echo credentials
    assert proxy.count("PUT") == 1  # not retried


def test_missing_credentials(bucket: str, aws_env: str, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    store = S3Storage(bucket, "run", retry=FAST_RETRY)
    with pytest.raises(StoragePermissionError, match="refused access"):
        store.list()


def test_unreachable_endpoint_is_transient_then_clear(bucket: str, aws_env: str):
    import socket

    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = S3Storage(bucket, "run", endpoint_url=f"http://127.0.0.1:{port}", retry=FAST_RETRY,
                      connect_timeout_s=1.0)  # fmt: skip
    with pytest.raises(TransientStorageError, match="still failing after 4 attempts"):
        store.put("k", b"x")
