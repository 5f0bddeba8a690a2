"""The storage seam: put / get / list / delete of checkpoint files under keys.

Keys are relative, '/'-separated paths such as ``step-00001200/manifest.json``. Backends know keys
and bytes, never training. Every backend (local, s3, memory, encrypted wrapper) passes the same
contract suite, :class:`spotwise.testing.StorageContract`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, overload, runtime_checkable

from spotwise.errors import ConfigError


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int


@runtime_checkable
class Storage(Protocol):
    """A flat key space of four methods. ``put`` is atomic per object: a reader sees all of it
    or nothing. Bytes and files share ``put`` and ``get`` (the type of the argument says which)
    and each backend keeps the fast path of each: one request for a small manifest held in
    memory, a streamed (multipart, parallel) transfer for a file, never read whole."""

    uri: str

    def put(self, key: str, data: bytes | Path) -> None:
        """Store ``data`` under ``key`` (overwrite allowed): the bytes, or the file at a Path."""
        ...

    @overload
    def get(self, key: str, dest: None = None) -> bytes: ...
    @overload
    def get(self, key: str, dest: Path) -> None: ...
    def get(self, key: str, dest: Path | None = None) -> bytes | None:
        """The object's bytes or, given ``dest``, the object written to that file (atomically,
        streamed); raises StorageNotFoundError if absent."""
        ...

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """All objects whose key starts with ``prefix``, sorted by key."""
        ...

    def delete(self, key: str) -> None:
        """Remove one object; deleting a missing key is not an error."""
        ...


def validate_key(key: str) -> str:
    """Reject keys that could escape the storage root (path traversal) or are ambiguous."""
    if not key or key.startswith("/") or "\\" in key or "\x00" in key:
        raise ConfigError(
            f"invalid storage key {key!r}",
            hint="keys are relative '/'-separated paths without '..', '\\\\' or a leading '/'",
        )
    parts = key.split("/")
    if any(p in ("", ".", "..") for p in parts[:-1]) or parts[-1] in ("", ".", ".."):
        raise ConfigError(
            f"invalid storage key {key!r}: empty, '.' or '..' path segment",
            hint="use plain names such as 'step-00000100/model.safetensors'",
        )
    return key
