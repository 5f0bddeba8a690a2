"""Storage backends by name, and ``open_storage(uri)`` choosing one by URI.

``/path`` or ``file:///path`` -> local, ``memory://name`` -> in-memory (tests), ``s3://bucket/prefix``
-> S3 (``spotwise[s3]``), ``gs://bucket/prefix`` -> Google Cloud Storage (``spotwise[gcs]``),
``az://container/prefix`` -> Azure Blob Storage (``spotwise[azureblob]``). Adding a backend: one
file plus one line below and, for a new URI scheme, one entry in ``SCHEMES``: the one list of
schemes that run dirs, ``ckpt`` and the docs (tests/test_registry_docs.py) follow.
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
        "gcs": Entry("spotwise.storage.gcs:GCSStorage", "gcs"),
        "azureblob": Entry("spotwise.storage.azureblob:AzureBlobStorage", "azureblob"),
    },
)

SCHEMES = {"file": "local", "memory": "memory", "s3": "s3", "gs": "gcs", "az": "azureblob"}


def scheme_of(uri: str) -> str | None:
    """``gs`` for ``gs://b/p``; None for a plain path."""
    return uri.split("://", 1)[0].lower() if "://" in uri else None


def is_object_store(uri: str) -> bool:
    """True for a URI that names a key space of an object store (any scheme but ``file://``)."""
    scheme = scheme_of(uri)
    return scheme is not None and SCHEMES.get(scheme, "local") != "local"


def object_store_schemes() -> list[str]:
    """``['az://', 'gs://', 's3://']``: the schemes a user may give as a remote run dir (the
    in-process ``memory://`` fake is for tests and left out)."""
    return sorted(f"{s}://" for s, name in SCHEMES.items() if name not in ("local", "memory"))


def backend_for(uri: str) -> str:
    """The registry name serving ``uri`` (a plain path is local)."""
    scheme = scheme_of(uri)
    if scheme is None:
        return "local"
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


__all__ = [
    "SCHEMES",
    "STORAGE",
    "ObjectInfo",
    "Storage",
    "backend_for",
    "is_object_store",
    "object_store_schemes",
    "open_storage",
    "scheme_of",
    "validate_key",
]
