"""Storage backends by name, and ``open_storage(uri)`` choosing one by URI.

``/path`` or ``file:///path`` -> local, ``memory://name`` -> in-memory (tests), ``s3://bucket/prefix``
-> S3 (needs ``pip install 'spotwise[s3]'``). Adding a backend: one file plus one line below and,
for a new URI scheme, one entry in ``SCHEMES``.
"""

from __future__ import annotations

from typing import Any

from spotwise.errors import ConfigError
from spotwise.registry import Entry, Registry
from spotwise.storage.base import ObjectInfo, Storage, validate_key

STORAGE: Registry[Storage] = Registry(
    "storage",
    {
        "local": "spotwise.storage.local:LocalStorage",
        "memory": "spotwise.storage.memory:MemoryStorage",
        "s3": Entry("spotwise.storage.s3:S3Storage", "s3"),
    },
)

SCHEMES = {"file": "local", "memory": "memory", "s3": "s3"}


def backend_for(uri: str) -> str:
    """The registry name serving ``uri`` (a plain path is local)."""
    if "://" not in uri:
        return "local"
    scheme = uri.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ConfigError(
            f"unsupported storage URI scheme {scheme!r} in {uri!r}",
            hint=f"use a local path or one of: {', '.join(f'{s}://' for s in sorted(SCHEMES))}",
        )
    return SCHEMES[scheme]


def open_storage(uri: str, **options: Any) -> Storage:
    """The backend for ``uri``, built with its ``from_uri`` constructor."""
    backend: Any = STORAGE.load(backend_for(uri))
    return backend.from_uri(uri, **options)


__all__ = ["STORAGE", "ObjectInfo", "Storage", "backend_for", "open_storage", "validate_key"]
