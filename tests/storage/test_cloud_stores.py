"""gs:// and az:// beyond the contract suite: the hostile cases the S3 tests have (bit rot, a
foreign overwrite, throttling, resets, refused access, missing bucket), large objects in pieces,
and configuration errors. The official google-cloud-storage and azure-storage-blob clients talk
to the loopback doubles over real HTTP."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from spotwise.checkpoint.remote import is_remote
from spotwise.errors import (
    ConfigError,
    IntegrityError,
    MissingExtraError,
    StorageNotFoundError,
    StoragePermissionError,
)
from spotwise.retry import RetryPolicy
from spotwise.storage import open_storage
from spotwise.storage.azureblob import AzureBlobStorage
from spotwise.storage.gcs import GCSStorage

FAST = RetryPolicy(max_attempts=3, base_delay_s=0.01, max_delay_s=0.05)
MiB = 1 << 20


@dataclass
class Cloud:
    name: str
    emulator: Any
    bucket: str
    make: Callable[..., Any]
    foreign_put: Callable[[str, bytes, dict[str, str]], None]  # another tool writes an object
    metadata_of: Callable[[str], dict[str, str]]
    upload_requests: Callable[[int], int]  # requests a file of N bytes takes (1 MiB pieces)
    wire: str  # a part of the path of every request about the test's objects (faults, counts)


@pytest.fixture(params=["gcs", "azureblob"])
def cloud(request: pytest.FixtureRequest) -> Cloud:
    if request.param == "gcs":
        from google.cloud import storage

        emulator = request.getfixturevalue("gcs_env")
        bucket = request.getfixturevalue("gcs_bucket")
        raw = storage.Client().bucket(bucket)

        def gcs_put(name: str, data: bytes, metadata: dict[str, str]) -> None:
            blob = raw.blob(name)
            blob.metadata = metadata
            blob.upload_from_string(data)

        def gcs_meta(name: str) -> dict[str, str]:
            return dict(raw.get_blob(name).metadata or {})

        return Cloud(
            "gcs", emulator, bucket,
            lambda prefix="run", **kw: GCSStorage(bucket, prefix, chunk_size=MiB, retry=FAST, **kw),
            gcs_put, gcs_meta,
            lambda size: 1 + -(-size // MiB),  # one session start, then one PUT per chunk
            f"/b/{bucket}/o",  # uploads name the object in the query or body, not the path
        )  # fmt: skip
    from azure.storage.blob import ContainerClient

    emulator = request.getfixturevalue("azure_blob_env")
    container = request.getfixturevalue("azure_container")
    client = ContainerClient.from_connection_string(emulator.connection_string(), container)

    def az_put(name: str, data: bytes, metadata: dict[str, str]) -> None:
        client.get_blob_client(name).upload_blob(data, metadata=metadata, overwrite=True)

    def az_meta(name: str) -> dict[str, str]:
        return dict(client.get_blob_client(name).get_blob_properties().metadata)

    return Cloud(
        "azureblob", emulator, container,
        lambda prefix="run", **kw: AzureBlobStorage(container, prefix, block_size=MiB, retry=FAST,
                                                    **kw),
        az_put, az_meta,
        lambda size: -(-size // MiB) + 1,  # one Put Block per block, then Put Block List
        f"/{container}/run/",
    )  # fmt: skip


def test_a_large_file_goes_up_in_pieces_and_comes_back_verified(cloud: Cloud, tmp_path: Path):
    source = tmp_path / "big.bin"
    source.write_bytes(bytes(range(256)) * (9 * MiB // 256) + b"tail")  # > 8 MiB: resumable
    store = cloud.make()
    store.put("step-00000001/big.bin", source)
    uploads = sum(1 for method, path, _ in cloud.emulator.requests
                  if method in ("POST", "PUT") and cloud.wire in path)  # fmt: skip
    assert uploads == cloud.upload_requests(source.stat().st_size)
    meta = cloud.metadata_of("run/step-00000001/big.bin")
    assert set(meta) == {"spotwise-crc32c" if cloud.name == "gcs" else "spotwise_crc32c"}
    store.get("step-00000001/big.bin", tmp_path / "back.bin")
    assert (tmp_path / "back.bin").read_bytes() == source.read_bytes()


def test_a_missing_source_file_is_named_and_nothing_is_stored(cloud: Cloud, tmp_path: Path):
    store = cloud.make()
    source = tmp_path / "gone.bin"
    with pytest.raises(StorageNotFoundError, match=f"cannot upload {source}: no such file"):
        store.put("k", source)
    assert store.list() == []


def test_bit_rot_fails_the_read_and_leaves_no_file(cloud: Cloud, tmp_path: Path) -> None:
    store = cloud.make()
    store.put("k", b"original bytes")
    cloud.emulator.corrupt(cloud.bucket, "run/k")
    with pytest.raises(IntegrityError, match="CRC32C"):
        store.get("k")
    # GCS's client checks GCS's own CRC32C on the wire first: a corrupt read is retried (it may
    # have been the network) before it is called corruption; Azure is checked by ours alone
    assert store.retries == (FAST.max_attempts - 1 if cloud.name == "gcs" else 0)
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(IntegrityError):
        store.get("k", out / "k")
    assert list(out.iterdir()) == []


def test_a_foreign_overwrite_keeping_the_recorded_crc_is_caught(cloud: Cloud) -> None:
    store = cloud.make()
    store.put("k", b"original")
    meta = cloud.metadata_of("run/k")
    cloud.foreign_put("run/k", b"tampered", meta)  # valid for the vendor, not for spotwise
    with pytest.raises(IntegrityError, match="recorded at upload"):
        store.get("k")


def test_throttling_5xx_and_resets_are_retried(cloud: Cloud) -> None:
    store = cloud.make()
    cloud.emulator.inject(503, count=1, on=cloud.wire)
    cloud.emulator.inject(429, count=1, on=cloud.wire)
    store.put("k", b"payload")
    assert store.retries == 2
    cloud.emulator.inject("close", count=1, on=cloud.wire)
    assert store.get("k") == b"payload"
    assert store.retries == 3


def test_a_store_that_keeps_failing_gives_up_with_a_hint(cloud: Cloud) -> None:
    from spotwise.errors import TransientStorageError

    store = cloud.make()
    cloud.emulator.inject(503, on=cloud.wire)
    with pytest.raises(TransientStorageError, match="after 3 attempts") as err:
        store.put("k", b"x")
    assert "RetryPolicy.max_attempts" in (err.value.hint or "")


def test_refused_access_fails_at_once_naming_the_role(cloud: Cloud) -> None:
    store = cloud.make()
    cloud.emulator.inject(403, count=1, on=cloud.wire)
    with pytest.raises(StoragePermissionError) as err:
        store.put("k", b"x")
    assert store.retries == 0
    role = "roles/storage.objectUser" if cloud.name == "gcs" else "Storage Blob Data Contributor"
    assert role in (err.value.hint or "")


def test_a_missing_bucket_is_named_with_the_command_that_creates_it(cloud: Cloud) -> None:
    cls = GCSStorage if cloud.name == "gcs" else AzureBlobStorage
    missing = cls("no-such-bucket", "run", retry=FAST)
    with pytest.raises(StorageNotFoundError, match="does not exist") as err:
        missing.get("k")
    assert "no-such-bucket" in (err.value.hint or "")
    with pytest.raises(StorageNotFoundError, match="does not exist"):
        missing.delete("k")  # a missing key is fine to delete; a missing bucket is not


def test_uris_open_through_the_registry(cloud: Cloud) -> None:
    scheme = "gs" if cloud.name == "gcs" else "az"
    uri = f"{scheme}://{cloud.bucket}/runs/a"
    store = open_storage(uri)
    assert isinstance(store, GCSStorage if cloud.name == "gcs" else AzureBlobStorage)
    assert store.uri == uri and is_remote(uri)
    store.put("x", b"1")
    assert cloud.metadata_of("runs/a/x")
    for bad in (f"{scheme}://", f"{scheme}:///prefix", f"{scheme}://b/../up"):
        with pytest.raises(ConfigError):
            open_storage(bad)


@pytest.mark.parametrize(
    ("uri", "module", "extra"),
    [
        ("gs://b/p", "google.cloud.storage", "gcs"),
        ("az://bkt/p", "azure.storage.blob", "azureblob"),
    ],
)
def test_a_missing_sdk_names_the_pip_line(uri, module, extra, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as in an install without the extra
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", "AccountName=x;AccountKey=eA==")
    with pytest.raises(MissingExtraError) as err:
        open_storage(uri)
    assert err.value.hint == f"pip install 'spotwise[{extra}]'"


def test_azure_without_an_account_says_which_variables(monkeypatch) -> None:
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT",
                 "AZURE_STORAGE_ACCOUNT_URL"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ConfigError, match="no Azure storage account for az://ckpts/run") as err:
        open_storage("az://ckpts/run")
    assert "AZURE_STORAGE_CONNECTION_STRING" in (err.value.hint or "")


def test_azure_wrong_key_is_refused_and_never_echoed(
    azure_blob_env, azure_container: str, monkeypatch, caplog
) -> None:
    from spotwise.emulators.azure_blob import ACCOUNT_KEY

    wrong = "V3Jvbmcta2V5LW5vdC10aGUtZGV2ZWxvcG1lbnQtYWNjb3VudC1rZXk="
    monkeypatch.setenv(
        "AZURE_STORAGE_CONNECTION_STRING",
        azure_blob_env.connection_string().replace(ACCOUNT_KEY, wrong),
    )
    caplog.set_level(logging.DEBUG)
    with pytest.raises(StoragePermissionError, match="Azure refused access") as err:
        AzureBlobStorage.from_uri(f"az://{azure_container}/run", retry=FAST).put("k", b"x")
    assert azure_blob_env.count(f"/{azure_container}/run/k", 403) == 1
    shown = str(err.value) + (err.value.hint or "") + caplog.text
    assert wrong not in shown and ACCOUNT_KEY not in shown
