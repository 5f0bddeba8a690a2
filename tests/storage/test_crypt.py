"""Encryption at rest: AES-256-GCM chunked frames over a real backend (S3 on loopback moto)."""

from __future__ import annotations

import base64
import os
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from spotwise.errors import ConfigError, EncryptionKeyError, IntegrityError
from spotwise.storage import crypt
from spotwise.storage.crypt import CHUNK, HEADER_LEN, TAG, EncryptedStorage, load_key

KEY = bytes(range(32))
OTHER_KEY = bytes(range(1, 33))


@pytest.fixture()
def plain(make_s3):
    return make_s3("enc")


@pytest.fixture()
def enc(plain, tmp_path: Path) -> EncryptedStorage:
    return EncryptedStorage(plain, KEY, spool_dir=tmp_path / "spool")


def _raw(plain, key: str) -> bytes:
    return plain.get(key)


def test_roundtrip_is_encrypted_at_rest(enc, plain, tmp_path: Path) -> None:
    secret = b"model weights " * 1000
    enc.put("step-1/state.json", secret)
    src = tmp_path / "w.bin"
    src.write_bytes(os.urandom(2 * CHUNK + 12345))
    enc.put("step-1/w.bin", src)

    stored = _raw(plain, "step-1/state.json")
    assert stored.startswith(b"SPOTWISE-ENCRYPTED aes-256-gcm-chunked-v1\n")  # scheme on record
    assert b"model weights" not in stored
    assert enc.get("step-1/state.json") == secret
    enc.get("step-1/w.bin", tmp_path / "out" / "w.bin")
    assert (tmp_path / "out" / "w.bin").read_bytes() == src.read_bytes()
    # listing reports plaintext sizes, computed from the stored sizes without any download
    assert [(o.key, o.size) for o in enc.list("step-1/")] == [
        ("step-1/state.json", len(secret)),
        ("step-1/w.bin", 2 * CHUNK + 12345),
    ]
    assert not any((tmp_path / "spool").iterdir())  # spool files are cleaned up


@pytest.mark.parametrize("size", [0, 1, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK])
def test_sizes_at_chunk_boundaries(size: int) -> None:
    import io

    cipher = crypt._Cipher(KEY)
    data = os.urandom(size)
    out = io.BytesIO()
    cipher.encrypt("k", io.BytesIO(data), size, out)
    stored = out.getvalue()
    assert crypt.plaintext_size(len(stored)) == size
    assert b"".join(cipher.decrypt("k", io.BytesIO(stored), len(stored))) == data


def _tamper_cases() -> dict[str, Any]:
    frame = CHUNK + TAG
    return {
        "flip a ciphertext bit": lambda b: b[:HEADER_LEN + 10] + bytes([b[HEADER_LEN + 10] ^ 1])
        + b[HEADER_LEN + 11 :],
        "drop the final chunk": lambda b: b[: HEADER_LEN + 2 * frame],
        "swap two chunks": lambda b: b[:HEADER_LEN] + b[HEADER_LEN + frame : HEADER_LEN + 2 * frame]
        + b[HEADER_LEN : HEADER_LEN + frame] + b[HEADER_LEN + 2 * frame :],
        "cut mid-chunk": lambda b: b[:-100],
        "append data": lambda b: b + b"x" * (frame),
        "tamper the wrapped key": lambda b: b[: HEADER_LEN - 1] + bytes([b[HEADER_LEN - 1] ^ 1]),
    }  # fmt: skip


@pytest.mark.parametrize("case", sorted(_tamper_cases()))
def test_tampering_is_detected(enc, plain, case: str) -> None:
    enc.put("w.bin", os.urandom(2 * CHUNK + 500))
    stored = _raw(plain, "w.bin")
    plain.put("w.bin", _tamper_cases()[case](stored))
    with pytest.raises(IntegrityError):
        enc.get("w.bin")


def test_object_moved_to_another_key_is_rejected(enc, plain) -> None:
    enc.put("step-1/model.safetensors", b"old weights")
    plain.put("step-2/model.safetensors", _raw(plain, "step-1/model.safetensors"))
    with pytest.raises(IntegrityError, match="moved from another key"):
        enc.get("step-2/model.safetensors")


def test_failed_decrypt_leaves_no_destination(enc, plain, tmp_path: Path) -> None:
    enc.put("w.bin", b"a" * (CHUNK + 10))
    plain.put("w.bin", _raw(plain, "w.bin")[:-1])
    dest = tmp_path / "dest" / "w.bin"
    with pytest.raises(IntegrityError):
        enc.get("w.bin", dest)
    assert not dest.exists() and list(dest.parent.iterdir()) == []


def test_wrong_key_is_a_clear_error(enc, plain, tmp_path: Path) -> None:
    enc.put("k", b"secret")
    other = EncryptedStorage(plain, OTHER_KEY)
    with pytest.raises(EncryptionKeyError, match="encrypted with another key") as err:
        other.get("k")
    assert "SPOTWISE_ENCRYPTION_KEY" in str(err.value)


def test_plain_object_read_through_encryption_is_a_clear_error(enc, plain) -> None:
    plain.put("k", b"plain text, never encrypted " * 10)
    with pytest.raises(IntegrityError, match="not an object in spotwise's"):
        enc.get("k")


def test_key_from_env_and_file(tmp_path: Path) -> None:
    b64 = base64.b64encode(KEY).decode()
    assert load_key({"SPOTWISE_ENCRYPTION_KEY": b64}) == KEY
    assert load_key({"SPOTWISE_ENCRYPTION_KEY": KEY.hex()}) == KEY
    (tmp_path / "k.txt").write_text(b64 + "\n")
    (tmp_path / "k.bin").write_bytes(KEY)
    assert load_key({"SPOTWISE_ENCRYPTION_KEY_FILE": str(tmp_path / "k.txt")}) == KEY
    assert load_key({"SPOTWISE_ENCRYPTION_KEY_FILE": str(tmp_path / "k.bin")}) == KEY
    assert load_key({}) is None
    with pytest.raises(EncryptionKeyError, match="not a 256-bit key") as err:
        load_key({"SPOTWISE_ENCRYPTION_KEY": "too-short"})
    assert "os.urandom(32)" in str(err.value)
    with pytest.raises(EncryptionKeyError, match="cannot read the encryption key file"):
        load_key({"SPOTWISE_ENCRYPTION_KEY_FILE": str(tmp_path / "missing")})


def test_from_env_wraps_only_when_configured(plain) -> None:
    assert EncryptedStorage.from_env(plain, {}) is plain
    wrapped = EncryptedStorage.from_env(plain, {"SPOTWISE_ENCRYPTION_KEY": KEY.hex()})
    assert isinstance(wrapped, EncryptedStorage) and wrapped.uri == plain.uri


def test_rejects_bad_keys_before_any_work(enc, tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        enc.put("../x", b"1")
    with pytest.raises(ConfigError):
        enc.put("/abs", tmp_path)


def test_memory_stays_bounded_for_large_files(tmp_path: Path) -> None:
    """Encrypting and decrypting a 48 MiB file never holds more than a few chunks in memory."""
    cipher = crypt._Cipher(KEY)
    src = tmp_path / "big"
    with open(src, "wb") as fh:
        for _ in range(48):
            fh.write(os.urandom(CHUNK))
    tracemalloc.start()
    try:
        with open(src, "rb") as s, open(tmp_path / "enc", "wb") as out:
            cipher.encrypt("big", s, src.stat().st_size, out)
        size = (tmp_path / "enc").stat().st_size
        with open(tmp_path / "enc", "rb") as s, open(tmp_path / "dec", "wb") as out:
            for plain in cipher.decrypt("big", s, size):
                out.write(plain)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * CHUNK, f"peak {peak / CHUNK:.1f} MiB"
    assert (tmp_path / "dec").read_bytes() == src.read_bytes()


@pytest.mark.parametrize("size", [0, CHUNK, 5 * CHUNK + 7])
def test_parallel_file_encryption_matches_the_stream_format(tmp_path: Path, size: int) -> None:
    cipher = crypt._Cipher(KEY)
    src = tmp_path / "src"
    src.write_bytes(os.urandom(size))
    cipher.encrypt_file("k", src, tmp_path / "enc", workers=3)
    stored = (tmp_path / "enc").read_bytes()
    assert crypt.plaintext_size(len(stored)) == size
    import io

    assert b"".join(cipher.decrypt("k", io.BytesIO(stored), len(stored))) == src.read_bytes()
