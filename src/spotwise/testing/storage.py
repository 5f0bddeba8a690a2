"""The Storage contract: every backend keeps the same promises to the checkpoint layer.

Subclass :class:`StorageContract` and define a ``store`` fixture returning an empty store of its
own (it may use ``tmp_path``). The checkpoint layer relies on exactly these behaviours: bytes and
files round-trip, a missing key is :class:`~spotwise.errors.StorageNotFoundError`, listings are
sorted and filtered by prefix, deletes are idempotent, and a key that could escape the store is
refused before any I/O.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from spotwise.errors import ConfigError, StorageNotFoundError
from spotwise.storage.base import ObjectInfo, Storage


class StorageContract:
    """Needs a ``store`` fixture: an empty :class:`~spotwise.storage.base.Storage`."""

    def test_is_a_storage(self, store: Storage) -> None:
        assert isinstance(store, Storage)
        assert isinstance(store.uri, str) and "://" in store.uri

    def test_bytes_round_trip_and_overwrite(self, store: Storage) -> None:
        payload = bytes(range(256)) * 3
        store.put("step-00000001/state.json", payload)
        assert store.get("step-00000001/state.json") == payload
        store.put("step-00000001/state.json", b"second")
        assert store.get("step-00000001/state.json") == b"second"

    def test_empty_object(self, store: Storage) -> None:
        store.put("empty", b"")
        assert store.get("empty") == b""
        assert store.list() == [ObjectInfo("empty", 0)]

    def test_file_round_trip(self, store: Storage, tmp_path: Path) -> None:
        source = tmp_path / "source.bin"
        source.write_bytes(b"\x00\xff" * (3 << 20))  # 6 MiB: more than one chunk/part anywhere
        store.put("step-00000002/tensors.safetensors", source)
        dest = tmp_path / "back.bin"
        assert store.get("step-00000002/tensors.safetensors", dest) is None  # (the file has it)
        assert dest.read_bytes() == source.read_bytes()

    def test_missing_keys_raise_not_found(self, store: Storage, tmp_path: Path) -> None:
        with pytest.raises(StorageNotFoundError):
            store.get("nope/manifest.json")
        with pytest.raises(StorageNotFoundError):
            store.get("nope/manifest.json", tmp_path / "x")
        assert not (tmp_path / "x").exists()

    def test_list_is_sorted_and_filtered_by_prefix(self, store: Storage) -> None:
        for key in ("step-00000200/b", "step-00000100/a", "step-00000100/c", "other"):
            store.put(key, key.encode())
        keys = [o.key for o in store.list()]
        assert keys == ["other", "step-00000100/a", "step-00000100/c", "step-00000200/b"]
        assert [o.key for o in store.list("step-00000100/")] == [
            "step-00000100/a",
            "step-00000100/c",
        ]
        assert [o.key for o in store.list("step-000001")] == ["step-00000100/a", "step-00000100/c"]
        assert store.list("absent/") == []
        assert {o.key: o.size for o in store.list()}["other"] == len(b"other")

    def test_delete(self, store: Storage) -> None:
        store.put("a/b", b"1")
        store.put("a/c", b"2")
        store.delete("a/b")
        store.delete("a/b")  # deleting a missing key is not an error
        assert [o.key for o in store.list()] == ["a/c"]
        with pytest.raises(StorageNotFoundError):
            store.get("a/b")

    @pytest.mark.parametrize(
        "key", ["../escape", "a/../../escape", "/abs", "a//b", "a/./b", "", "a\\b", "a/", "nul\x00"]
    )
    def test_path_traversal_and_bad_keys_rejected(
        self, store: Storage, key: str, tmp_path: Path
    ) -> None:
        with pytest.raises(ConfigError):
            store.put(key, b"x")
        with pytest.raises(ConfigError):
            store.get(key)
        with pytest.raises(ConfigError):
            store.delete(key)
        assert not (tmp_path / "escape").exists()
