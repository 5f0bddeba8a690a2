"""Factories of every Storage backend that the contract suite runs against.

To add a backend, add one entry: ``name -> factory(request, tmp_path) -> Storage``. A factory
may pull fixtures with ``request.getfixturevalue(...)`` (e.g. ``aws_env`` for the loopback S3
server) and must return an empty store of its own.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from spotwise.storage.base import Storage
from spotwise.storage.local import LocalStorage
from spotwise.storage.memory import MemoryStorage

Factory = Callable[[pytest.FixtureRequest, Path], Storage]

BACKENDS: dict[str, Factory] = {
    "local": lambda request, tmp_path: LocalStorage(tmp_path / "store"),
    "memory": lambda request, tmp_path: MemoryStorage(f"contract-{uuid.uuid4().hex}"),
}
