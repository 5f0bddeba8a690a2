"""Storage backends by name, and ``open_storage(uri)`` choosing one by URI.

``/path`` or ``file:///path`` -> local, ``memory://name`` -> in-memory (tests), ``s3://bucket/prefix``
-> S3 (``spotwise[s3]``), ``gs://bucket/prefix`` -> Google Cloud Storage (``spotwise[gcs]``),
``az://container/prefix`` -> Azure Blob Storage (``spotwise[azureblob]``). A backend's registry
name is its URI scheme (only ``local`` is spelt ``file://``), so adding one is one file plus one
line below, or an entry point in the ``spotwise.storage`` group of another package.
"""

from __future__ import annotations

import os
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
        "gs": Entry("spotwise.storage.gcs:GCSStorage", "gcs"),
        "az": Entry("spotwise.storage.azureblob:AzureBlobStorage", "azureblob"),
    },
    group="spotwise.storage",
)

LOCAL = "local"  # the one backend whose scheme is not its name: file:///path, or a plain path


def schemes() -> list[str]:
    """Every URI scheme a run directory may use, from the registry."""
    return sorted(("file" if name == LOCAL else name) for name in STORAGE.names())


def object_store_schemes() -> list[str]:
    """``['az://', 'gs://', 's3://']``: the schemes a user may give as a remote run dir (the
    in-process ``memory://`` fake is for tests and left out)."""
    return [f"{s}://" for s in schemes() if s not in ("file", "memory")]


def backend_for(uri: str) -> str:
    """The registry name serving ``uri`` (a plain path is local)."""
    if "://" not in uri:
        return LOCAL
    scheme = uri.split("://", 1)[0].lower()
    if scheme == "file":
        return LOCAL
    if scheme == LOCAL or scheme not in STORAGE:
        raise ConfigError(
            f"unsupported storage URI scheme {scheme!r} in {uri!r}",
            hint=f"use a local path or one of: {', '.join(f'{s}://' for s in schemes())}",
        )
    return scheme


def is_remote(location: str | os.PathLike[str]) -> bool:
    """True when ``location`` names an object store rather than a local directory (an unknown
    ``scheme://`` is refused, never taken for a folder named ``scheme:``)."""
    text = os.fspath(location)
    return "://" in text and backend_for(text) != LOCAL


def open_storage(uri: str, **options: Any) -> Storage:
    """The backend for ``uri``, built with its ``from_uri`` constructor."""
    backend: Any = STORAGE.load(backend_for(uri))
    return backend.from_uri(uri, **options)


__all__ = [
    "STORAGE",
    "ObjectInfo",
    "Storage",
    "backend_for",
    "is_remote",
    "object_store_schemes",
    "open_storage",
    "schemes",
    "validate_key",
]
