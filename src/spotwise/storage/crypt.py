"""Encryption at rest: a wrapper that encrypts every object of any ``Storage``.

Scheme ``aes-256-gcm-chunked-v1`` (recorded in clear at the start of every object, so a reader
knows what it is looking at):

    header  = SCHEME_LINE | key_id (8) | wrap_nonce (12) | AES-GCM(KEK, data_key) (32 + 16 tag)
    chunk i = AES-GCM(data_key, nonce = i as 12 bytes, aad = SCHEME_LINE | i | final flag)

* A fresh random 256-bit data key per object, wrapped by the key-encryption key (KEK) from
  ``SPOTWISE_ENCRYPTION_KEY`` / ``SPOTWISE_ENCRYPTION_KEY_FILE``. The wrap is bound to the object's
  key, so an object copied or swapped to another key fails authentication.
* Plaintext is cut into 1 MiB chunks, so memory stays bounded for multi-GB files; the chunk index
  and a final flag in the authenticated data detect truncation, reordering and appended data.
  Nonces can be counters because no data key ever encrypts two objects.
* ``key_id`` (an HMAC of the KEK, revealing nothing about it) turns "wrong key" into a clear error
  instead of an authentication failure.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import hmac
import io
import os
import struct
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any, overload

from spotwise import settings
from spotwise.checkpoint.durable import write_atomic
from spotwise.errors import EncryptionKeyError, IntegrityError
from spotwise.registry import require
from spotwise.storage.base import ObjectInfo, Storage, validate_key

_KEY, _KEY_FILE = settings.ENCRYPTION_KEY, settings.ENCRYPTION_KEY_FILE
SCHEME = "aes-256-gcm-chunked-v1"
SCHEME_LINE = f"SPOTWISE-ENCRYPTED {SCHEME}\n".encode()
CHUNK = 1024 * 1024
TAG = 16
_KEY_ID_LEN = 8
_NONCE = 12
HEADER_LEN = len(SCHEME_LINE) + _KEY_ID_LEN + _NONCE + 32 + TAG
_KEYGEN = 'python -c "import os,base64; print(base64.b64encode(os.urandom(32)).decode())"'


# --- keys --------------------------------------------------------------------------------------
def parse_key(text_or_bytes: str | bytes, source: str) -> bytes:
    """A 256-bit key from base64 (44 chars), hex (64 chars) or raw 32 bytes."""
    raw = text_or_bytes if isinstance(text_or_bytes, bytes) else text_or_bytes.encode()
    if len(raw) == 32 and isinstance(text_or_bytes, bytes):
        return raw
    text = raw.strip()
    decoders = (binascii.unhexlify, lambda t: base64.b64decode(t, validate=True))
    for decode in decoders:  # hex first: 64 hex digits are also valid base64
        with contextlib.suppress(binascii.Error):
            key = decode(text)
            if len(key) == 32:
                return key
    raise EncryptionKeyError(
        f"the encryption key from {source} is not a 256-bit key (base64 or hex of 32 bytes)",
        hint=f"generate one with: {_KEYGEN}",
    )


def load_key(env: Mapping[str, str] | None = None) -> bytes | None:
    """The KEK configured in the environment, or None when encryption is not configured."""
    if _KEY.raw(env):
        return parse_key(_KEY.raw(env), _KEY.name)
    path = _KEY_FILE.text(env)
    if path:
        try:
            return parse_key(Path(path).expanduser().read_bytes(), f"{_KEY_FILE.name}={path}")
        except OSError as exc:
            raise EncryptionKeyError(
                f"cannot read the encryption key file {path}: {exc.strerror}",
                hint=f"fix {_KEY_FILE.name} or set {_KEY.name}",
            ) from exc
    return None


def key_id(kek: bytes) -> bytes:
    return hmac.new(kek, b"spotwise key id v1", hashlib.sha256).digest()[:_KEY_ID_LEN]


def looks_encrypted(head: bytes) -> bool:
    """True if these leading bytes start an object written by ``EncryptedStorage``."""
    return head.startswith(SCHEME_LINE[:19])


def plaintext_size(stored_size: int) -> int:
    """Plaintext length of an encrypted object of ``stored_size`` bytes (no download needed)."""
    body = stored_size - HEADER_LEN
    if body < TAG:
        return 0
    chunks = -(-body // (CHUNK + TAG))
    return body - TAG * chunks


def _chunk_count(plain_size: int) -> int:
    return max(1, -(-plain_size // CHUNK))


def _nonce(index: int) -> bytes:
    return struct.pack(">4xQ", index)


def _chunk_aad(index: int, final: bool) -> bytes:
    return SCHEME_LINE + struct.pack(">QB", index, int(final))


# --- streaming cipher --------------------------------------------------------------------------
class _Cipher:
    def __init__(self, kek: bytes) -> None:
        if len(kek) != 32:
            raise EncryptionKeyError(
                "the encryption key must be 32 bytes (AES-256)", hint=f"generate: {_KEYGEN}"
            )
        aead = require("cryptography.hazmat.primitives.ciphers.aead", "crypto", "encryption")
        exceptions = require("cryptography.exceptions", "crypto", "encryption")
        self._aesgcm = aead.AESGCM
        self._invalid_tag = exceptions.InvalidTag
        self._kek = aead.AESGCM(kek)
        self.key_id = key_id(kek)

    def _start(self, name: str) -> tuple[bytes, Any]:
        """A fresh data key: the object's header (with the key wrapped) and its cipher."""
        data_key = os.urandom(32)
        wrap_nonce = os.urandom(_NONCE)
        wrapped = self._kek.encrypt(wrap_nonce, data_key, self._wrap_aad(name))
        return SCHEME_LINE + self.key_id + wrap_nonce + wrapped, self._aesgcm(data_key)

    def encrypt(self, name: str, source: IO[bytes], size: int, out: IO[bytes]) -> None:
        header, aead = self._start(name)
        out.write(header)
        count = _chunk_count(size)
        for index in range(count):
            chunk = source.read(CHUNK)
            final = index == count - 1
            out.write(aead.encrypt(_nonce(index), chunk, _chunk_aad(index, final)))
        if source.read(1):
            raise IntegrityError(f"{name}: the source grew while it was being encrypted")

    def encrypt_file(self, name: str, source: Path, dest: Path, workers: int = 4) -> None:
        """Like ``encrypt`` for files, with chunks encrypted in parallel: every frame has a fixed
        offset in the output, so workers read with pread and write with pwrite. Memory stays
        at about two chunks per worker."""
        header, aead = self._start(name)
        with open(source, "rb") as src, open(dest, "wb") as out:
            size = os.fstat(src.fileno()).st_size
            count = _chunk_count(size)
            _pwrite_all(out.fileno(), header, 0)

            def one(index: int) -> None:
                final = index == count - 1
                plain = os.pread(src.fileno(), CHUNK, index * CHUNK)
                if len(plain) != (size - index * CHUNK if final else CHUNK):
                    raise IntegrityError(f"{name}: the source changed while it was encrypted")
                frame = aead.encrypt(_nonce(index), plain, _chunk_aad(index, final))
                _pwrite_all(out.fileno(), frame, HEADER_LEN + index * (CHUNK + TAG))

            with ThreadPoolExecutor(workers, thread_name_prefix="spotwise-crypt") as pool:
                for _ in pool.map(one, range(count)):
                    pass  # re-raises the first failure

    def decrypt(self, name: str, source: IO[bytes], stored_size: int) -> Iterator[bytes]:
        header = source.read(HEADER_LEN)
        if not header.startswith(SCHEME_LINE):
            raise IntegrityError(
                f"{name}: not an object in spotwise's {SCHEME} format (or its header is damaged)",
                hint="it was written without encryption, or by something else; read it without "
                f"{_KEY.name}",
            )
        offset = len(SCHEME_LINE)
        stored_id = header[offset : offset + _KEY_ID_LEN]
        if stored_id != self.key_id:
            raise EncryptionKeyError(
                f"{name} was encrypted with another key (key id {stored_id.hex()}; the "
                f"configured key has id {self.key_id.hex()})",
                hint=f"set {_KEY.name} (or {_KEY_FILE.name}) to the key used when it was written",
            )
        offset += _KEY_ID_LEN
        wrap_nonce = header[offset : offset + _NONCE]
        try:
            data_key = self._kek.decrypt(
                wrap_nonce, header[offset + _NONCE :], self._wrap_aad(name)
            )
        except self._invalid_tag as exc:
            raise IntegrityError(
                f"{name}: the encrypted data key fails authentication (header tampered, or the "
                "object was moved from another key)"
            ) from exc
        aead = self._aesgcm(data_key)
        count = _chunk_count(plaintext_size(stored_size))
        for index in range(count):
            block = source.read(CHUNK + TAG)
            final = index == count - 1
            try:
                yield aead.decrypt(_nonce(index), block, _chunk_aad(index, final))
            except self._invalid_tag as exc:
                raise IntegrityError(
                    f"{name}: chunk {index} of {count} fails authentication (tampered, "
                    "truncated or reordered data)",
                    hint="use an older checkpoint; this object cannot be trusted",
                ) from exc
        if source.read(1):
            raise IntegrityError(f"{name}: unexpected data after the final chunk")

    @staticmethod
    def _wrap_aad(name: str) -> bytes:
        return SCHEME_LINE + name.encode()


def _pwrite_all(fd: int, data: bytes, offset: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


# --- the wrapper -------------------------------------------------------------------------------
class EncryptedStorage:
    """Any ``Storage`` with AES-256-GCM at rest; implements the ``Storage`` protocol itself.

    Files are encrypted to and decrypted from a spool file (``spool_dir``, default the system temp
    dir) one chunk at a time, so memory use does not depend on the file size.
    """

    def __init__(self, inner: Storage, kek: bytes, *, spool_dir: Path | None = None) -> None:
        self.inner = inner
        self.uri = inner.uri
        self.scheme = SCHEME
        self._cipher = _Cipher(kek)
        self._spool_dir = spool_dir

    @classmethod
    def from_env(cls, inner: Storage, env: Mapping[str, str] | None = None, **kw: Any) -> Storage:
        """Wrap ``inner`` if a key is configured in the environment; else return it unchanged."""
        kek = load_key(env)
        return inner if kek is None else cls(inner, kek, **kw)

    def _spool(self, hint: str) -> Path:
        base = self._spool_dir or Path(tempfile.gettempdir())
        base.mkdir(parents=True, exist_ok=True)
        return base / f".spotwise-crypt-{uuid.uuid4().hex[:12]}-{Path(hint).name}"

    def put(self, key: str, data: bytes | Path) -> None:
        validate_key(key)
        if not isinstance(data, Path):
            out = io.BytesIO()
            self._cipher.encrypt(key, io.BytesIO(data), len(data), out)
            self.inner.put(key, out.getvalue())
            return
        spool = self._spool(key)
        try:
            self._cipher.encrypt_file(key, data, spool)
            self.inner.put(key, spool)
        finally:
            spool.unlink(missing_ok=True)

    @overload
    def get(self, key: str, dest: None = None) -> bytes: ...
    @overload
    def get(self, key: str, dest: Path) -> None: ...
    def get(self, key: str, dest: Path | None = None) -> bytes | None:
        if dest is None:
            data = self.inner.get(key)
            return b"".join(self._cipher.decrypt(key, io.BytesIO(data), len(data)))
        spool = self._spool(key)
        try:
            self.inner.get(key, spool)
            dest.parent.mkdir(parents=True, exist_ok=True)
            with open(spool, "rb") as src:
                size = os.fstat(src.fileno()).st_size
                write_atomic(dest, lambda out: out.writelines(self._cipher.decrypt(key, src, size)))
        finally:
            spool.unlink(missing_ok=True)
        return None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        return [ObjectInfo(o.key, plaintext_size(o.size)) for o in self.inner.list(prefix)]

    def delete(self, key: str) -> None:
        self.inner.delete(key)
