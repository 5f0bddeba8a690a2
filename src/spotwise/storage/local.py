"""A directory on a local (or mounted network) file system as a Storage backend.

Every put writes a hidden temporary file next to the destination, fsyncs it, renames it into
place and fsyncs the directory, so a reader (or a crash) sees the whole object or none of it.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from spotwise.errors import (
    StorageError,
    StorageFullError,
    StorageNotFoundError,
    StoragePermissionError,
)
from spotwise.storage.base import ObjectInfo, validate_key

TMP_PREFIX = ".spotwise-tmp-"  # names of in-progress puts; never listed


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn OSErrors into the storage exception tree, naming the path and the fix."""
    try:
        yield
    except FileNotFoundError as exc:
        raise StorageNotFoundError(f"{what}: not found ({exc.filename})") from exc
    except OSError as exc:
        from spotwise.runtime.commit import disk_problem  # the errno map checkpoints use

        problem = disk_problem(exc)
        if problem in ("full", "too-large"):
            raise StorageFullError(
                f"{what}: no space left ({exc.strerror})", hint="free space or use a larger disk"
            ) from exc
        if problem == "read-only":
            raise StoragePermissionError(
                f"{what}: not writable ({exc.strerror})",
                hint="check the directory's permissions or choose a writable location",
            ) from exc
        raise StorageError(f"{what}: {exc}") from exc


class LocalStorage:
    """Objects are files under ``root``; keys map to relative paths."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser().absolute()
        self.uri = f"file://{self.root}"

    @classmethod
    def from_uri(cls, uri: str, **_: Any) -> LocalStorage:
        return cls(uri[len("file://") :] if uri.startswith("file://") else uri)

    def _path(self, key: str) -> Path:
        return self.root / validate_key(key)

    def _atomic_write(self, key: str, fill: Any) -> None:
        dest = self._path(key)
        with _translated(f"cannot store {key!r} in {self.root}"):
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(f"{TMP_PREFIX}{dest.name}-{uuid.uuid4().hex[:8]}")
            try:
                with open(tmp, "xb") as out:
                    fill(out)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, dest)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            from spotwise.runtime.commit import fsync_dir  # the one directory fsync

            fsync_dir(dest.parent)

    def put_file(self, key: str, source: Path) -> None:
        with _translated(f"cannot read {source}"), open(source, "rb") as src:
            self._atomic_write(key, lambda out: shutil.copyfileobj(src, out, 16 << 20))

    def put_bytes(self, key: str, data: bytes) -> None:
        self._atomic_write(key, lambda out: out.write(data))

    def get_file(self, key: str, dest: Path) -> None:
        source = self._path(key)
        dest = Path(dest)
        tmp = dest.with_name(f"{TMP_PREFIX}{dest.name}-{uuid.uuid4().hex[:8]}")
        with _translated(f"cannot fetch {key!r} from {self.root}"):
            try:
                shutil.copyfile(source, tmp)
                os.replace(tmp, dest)
            finally:
                tmp.unlink(missing_ok=True)

    def get_bytes(self, key: str) -> bytes:
        with _translated(f"cannot fetch {key!r} from {self.root}"):
            return self._path(key).read_bytes()

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        found = []
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith(TMP_PREFIX)]
            rel = os.path.relpath(dirpath, self.root)
            base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in filenames:
                key = base + name
                if name.startswith(TMP_PREFIX) or not key.startswith(prefix):
                    continue
                try:
                    found.append(ObjectInfo(key, os.stat(os.path.join(dirpath, name)).st_size))
                except FileNotFoundError:
                    continue  # deleted while listing
        return sorted(found, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        path = self._path(key)
        with _translated(f"cannot delete {key!r} from {self.root}"):
            path.unlink(missing_ok=True)
            parent = path.parent
            while parent != self.root and parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()  # keep the tree free of empty directories
                parent = parent.parent
