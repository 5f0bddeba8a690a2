"""An in-memory Storage: the fake used in unit tests, passing the same contract suite.

Stores opened by the same ``memory://name`` URI share their objects (like one bucket seen by
two clients) within the process.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, ClassVar, overload

from spotwise.checkpoint.durable import write_atomic
from spotwise.errors import StorageNotFoundError
from spotwise.storage.base import ObjectInfo, validate_key


class MemoryStorage:
    _named: ClassVar[dict[str, dict[str, bytes]]] = {}
    _named_lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self, name: str | None = None) -> None:
        self.uri = f"memory://{name or ''}"
        self._lock = threading.Lock()
        if name is None:
            self._objects: dict[str, bytes] = {}
        else:
            with MemoryStorage._named_lock:
                self._objects = MemoryStorage._named.setdefault(name, {})

    @classmethod
    def from_uri(cls, uri: str, **_: Any) -> MemoryStorage:
        return cls(uri[len("memory://") :] or None)

    def put(self, key: str, data: bytes | Path) -> None:
        validate_key(key)
        value = data.read_bytes() if isinstance(data, Path) else bytes(data)
        with self._lock:
            self._objects[key] = value

    @overload
    def get(self, key: str, dest: None = None) -> bytes: ...
    @overload
    def get(self, key: str, dest: Path) -> None: ...
    def get(self, key: str, dest: Path | None = None) -> bytes | None:
        validate_key(key)
        with self._lock:
            try:
                value = self._objects[key]
            except KeyError:
                raise StorageNotFoundError(f"no object {key!r} in {self.uri}") from None
        if dest is None:
            return value
        write_atomic(dest, value)
        return None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        with self._lock:
            items = [(k, len(v)) for k, v in self._objects.items() if k.startswith(prefix)]
        return [ObjectInfo(k, size) for k, size in sorted(items)]

    def delete(self, key: str) -> None:
        validate_key(key)
        with self._lock:
            self._objects.pop(key, None)
