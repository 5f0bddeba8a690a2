"""S3Storage against the real moto S3 server on loopback, with the real boto3 client."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from spotwise.errors import (
    ConfigError,
    IntegrityError,
    StorageNotFoundError,
)
from spotwise.storage.s3 import (
    Failure,
    MiB,
    RetryPolicy,
    S3Storage,
    TransferSettings,
    classify,
    parse_s3_uri,
    plan_parts,
)


def test_roundtrip_bytes_and_files(make_s3, tmp_path: Path) -> None:
    store = make_s3()
    store.put("step-00000001/state.json", b'{"step": 1}')
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(1000))
    store.put("step-00000001/model.safetensors", src)

    assert store.get("step-00000001/state.json") == b'{"step": 1}'
    dest = tmp_path / "out" / "w.bin"
    store.get("step-00000001/model.safetensors", dest)
    assert dest.read_bytes() == src.read_bytes()
    assert [(o.key, o.size) for o in store.list()] == [
        ("step-00000001/model.safetensors", 1000),
        ("step-00000001/state.json", 11),
    ]
    store.delete("step-00000001/state.json")
    store.delete("step-00000001/state.json")  # deleting twice is fine
    assert [o.key for o in store.list("step-00000001/")] == ["step-00000001/model.safetensors"]
    assert list(dest.parent.iterdir()) == [dest]  # no temp file left behind


def test_prefixes_are_isolated(make_s3) -> None:
    a, b = make_s3("runs/a"), make_s3("runs/ab")
    a.put("x", b"1")
    b.put("x", b"2")
    assert [o.key for o in a.list()] == ["x"]
    assert a.get("x") == b"1" and b.get("x") == b"2"
    assert a.uri.endswith("/runs/a")


def test_empty_object(make_s3, tmp_path: Path) -> None:
    store = make_s3()
    (tmp_path / "empty").write_bytes(b"")
    store.put("e", tmp_path / "empty")
    store.get("e", tmp_path / "back")
    assert (tmp_path / "back").read_bytes() == b""
    assert store.get("e") == b""


def test_multipart_upload_and_parallel_ranged_download(
    make_s3, s3_client: Any, bucket: str, tmp_path: Path
) -> None:
    store = make_s3()
    src = tmp_path / "big.bin"
    src.write_bytes(os.urandom(12 * MiB + 123))
    store.put("big.bin", src)
    head = s3_client.head_object(Bucket=bucket, Key="run/big.bin")
    assert head["ETag"].strip('"').endswith("-3")  # three parts: 5 + 5 + 2 MiB
    assert s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []
    dest = tmp_path / "back.bin"
    store.get("big.bin", dest)
    assert dest.read_bytes() == src.read_bytes()


def test_download_verifies_checksum(make_s3, s3_client: Any, bucket: str, tmp_path: Path) -> None:
    store = make_s3()
    store.put("k", b"original")
    meta = s3_client.head_object(Bucket=bucket, Key="run/k")["Metadata"]
    # Another writer replaces the bytes but the recorded CRC32C stays: corruption in storage.
    s3_client.put_object(Bucket=bucket, Key="run/k", Body=b"tampered", Metadata=meta)
    with pytest.raises(IntegrityError, match="CRC32C"):
        store.get("k")
    with pytest.raises(IntegrityError):
        store.get("k", tmp_path / "k")
    assert not (tmp_path / "k").exists()
    assert list(tmp_path.iterdir()) == []


def test_missing_key_and_missing_bucket(aws_env: str, make_s3, tmp_path: Path) -> None:
    store = make_s3()
    with pytest.raises(StorageNotFoundError):
        store.get("nope")
    with pytest.raises(StorageNotFoundError):
        store.get("nope", tmp_path / "x")
    ghost = S3Storage("no-such-bucket-spotwise", "p", retry=RetryPolicy(max_attempts=2))
    with pytest.raises(StorageNotFoundError, match="no-such-bucket-spotwise' does not") as e:
        ghost.put("k", b"x")
    assert "aws s3 mb" in str(e.value)
    with pytest.raises(StorageNotFoundError, match="does not exist"):
        ghost.list()


def test_a_missing_source_file_is_named_and_nothing_is_stored(make_s3, tmp_path: Path) -> None:
    store = make_s3()
    source = tmp_path / "gone.bin"
    with pytest.raises(StorageNotFoundError, match=f"cannot upload {source}: no such file"):
        store.put("k", source)
    assert store.list() == []


def test_endpoint_from_aws_endpoint_url_s3(aws_env: str, bucket: str, monkeypatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", aws_env)
    store = S3Storage.from_uri(f"s3://{bucket}/deep/prefix/")
    store.put("a", b"1")
    assert store.uri == f"s3://{bucket}/deep/prefix"
    assert store.list() == [type(store.list()[0])("a", 1)]


def test_rejects_bad_keys_and_uris(make_s3) -> None:
    store = make_s3()
    for key in ("../escape", "/abs", "a/../b", ""):
        with pytest.raises(ConfigError):
            store.put(key, b"x")
    with pytest.raises(ConfigError):
        store.list("../")
    for uri in ("s3://", "s3:///prefix", "file:///x", "s3://b/../up"):
        with pytest.raises(ConfigError):
            parse_s3_uri(uri)
    with pytest.raises(ConfigError, match="5 MiB"):
        TransferSettings(part_size=1024)


def test_plan_parts_covers_file_and_respects_part_limit() -> None:
    parts = plan_parts(12 * MiB + 1, 5 * MiB)
    assert parts == [(0, 5 * MiB), (5 * MiB, 5 * MiB), (10 * MiB, 2 * MiB + 1)]
    huge = plan_parts(100_000 * 5 * MiB, 5 * MiB)
    assert len(huge) <= 10_000 and sum(n for _, n in huge) == 100_000 * 5 * MiB
    assert plan_parts(0, 5 * MiB) == []


def test_retry_policy_backoff_is_bounded_full_jitter() -> None:
    policy = RetryPolicy(base_delay_s=0.5, max_delay_s=4.0)
    assert policy.delay_s(1, 0.999) < 0.5
    assert policy.delay_s(3, 0.5) == pytest.approx(1.0)
    assert policy.delay_s(30, 0.999) < 4.0
    assert policy.delay_s(5, 0.0) == 0.0


class _FakeVendorError(Exception):
    def __init__(self, code: str, status: int) -> None:
        self.response = {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}


@pytest.mark.parametrize(
    ("code", "status", "expected"),
    [
        ("SlowDown", 503, Failure.RETRY),
        ("InternalError", 500, Failure.RETRY),
        ("Whatever", 502, Failure.RETRY),
        ("NoSuchBucket", 404, Failure.NO_BUCKET),
        ("NoSuchKey", 404, Failure.NOT_FOUND),
        ("InvalidAccessKeyId", 403, Failure.PERMISSION),
        ("SignatureDoesNotMatch", 403, Failure.PERMISSION),
        ("InvalidArgument", 400, Failure.FATAL),
    ],
)
def test_classify_vendor_errors(code: str, status: int, expected: Failure) -> None:
    assert classify(_FakeVendorError(code, status)) is expected


def test_classify_network_errors() -> None:
    from botocore.exceptions import (
        ConnectionClosedError,
        NoCredentialsError,
        ReadTimeoutError,
    )

    assert classify(ReadTimeoutError(endpoint_url="http://x")) is Failure.RETRY
    assert classify(ConnectionClosedError(endpoint_url="http://x")) is Failure.RETRY
    assert classify(ConnectionResetError()) is Failure.RETRY
    assert classify(NoCredentialsError()) is Failure.PERMISSION
    assert classify(ValueError("bug")) is Failure.FATAL


def test_abort_incomplete_uploads_left_by_a_killed_process(
    make_s3, s3_client: Any, bucket: str
) -> None:
    store = make_s3()
    s3_client.create_multipart_upload(Bucket=bucket, Key="run/step-00000100/tensors.safetensors")
    s3_client.create_multipart_upload(Bucket=bucket, Key="elsewhere/x")  # not under our prefix
    # (moto reports every upload as initiated in 2010, so the age filter lets both through)
    assert store.abort_incomplete_uploads(older_than_s=3600) == 1
    left = s3_client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in left] == ["elsewhere/x"]
