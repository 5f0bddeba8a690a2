"""A directory on a local (or mounted network) file system as a Storage backend.

Every put writes a hidden temporary file next to the destination, fsyncs it, renames it into
place and fsyncs the directory, so a reader (or a crash) sees the whole object or none of it.
A key is reached one directory at a time from the root's descriptor without following links
(:mod:`spotwise.dirfd`): a link planted under the root (``step-00000070 -> /elsewhere``) is
neither listed, read, written nor deleted through.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, overload

from spotwise.checkpoint.durable import (
    ATOMIC_TMP_PREFIX,
    disk_problem,
    write_atomic,
    write_atomic_at,
)
from spotwise.dirfd import open_entry, opened_path
from spotwise.errors import (
    StorageError,
    StorageFullError,
    StorageNotFoundError,
    StoragePermissionError,
)
from spotwise.storage.base import ObjectInfo, validate_key


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn OSErrors into the storage exception tree, naming the path and the fix."""
    try:
        yield
    except FileNotFoundError as exc:
        raise StorageNotFoundError(f"{what}: not found ({exc.filename})") from exc
    except OSError as exc:
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

    def _parts(self, key: str) -> tuple[list[str], str]:
        """The directories and the file name of ``key`` (validated: no escape by name)."""
        *dirs, name = validate_key(key).split("/")
        return dirs, name

    @contextmanager
    def _opened(self, key: str, flags: int) -> Iterator[IO[bytes]]:
        """Object ``key`` opened for reading, never through a link."""
        dirs, name = self._parts(key)
        with opened_path(self.root, dirs) as fds:
            fd = open_entry(fds[-1], name, flags | os.O_NONBLOCK)
        with open(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise FileNotFoundError(f"{self.root / key} is not a regular file")
            yield file

    def _atomic_write(self, key: str, fill: Any) -> None:
        dirs, name = self._parts(key)
        with _translated(f"cannot store {key!r} in {self.root}"):
            self.root.mkdir(parents=True, exist_ok=True)
            with opened_path(self.root, dirs, create=True) as fds:
                write_atomic_at(fds[-1], name, fill)

    def put(self, key: str, data: bytes | Path) -> None:
        if not isinstance(data, Path):
            self._atomic_write(key, lambda out: out.write(data))
            return
        with _translated(f"cannot read {data}"), open(data, "rb") as src:
            self._atomic_write(key, lambda out: shutil.copyfileobj(src, out, 16 << 20))

    @overload
    def get(self, key: str, dest: None = None) -> bytes: ...
    @overload
    def get(self, key: str, dest: Path) -> None: ...
    def get(self, key: str, dest: Path | None = None) -> bytes | None:
        with (
            _translated(f"cannot fetch {key!r} from {self.root}"),
            self._opened(key, os.O_RDONLY) as src,
        ):
            if dest is None:
                return src.read()
            write_atomic(dest, lambda out: shutil.copyfileobj(src, out, 16 << 20))
            return None

    def list(self, prefix: str = "") -> list[ObjectInfo]:
        """Every regular file under the root; a link (to a file or a directory) is no object
        and is not descended into."""
        found: list[ObjectInfo] = []
        if not self.root.is_dir():
            return found
        for dirpath, dirnames, filenames, dir_fd in os.fwalk(self.root):
            dirnames[:] = [d for d in dirnames if not d.startswith(ATOMIC_TMP_PREFIX)]
            rel = os.path.relpath(dirpath, self.root)
            base = "" if rel == "." else rel.replace(os.sep, "/") + "/"
            for name in filenames:
                key = base + name
                if name.startswith(ATOMIC_TMP_PREFIX) or not key.startswith(prefix):
                    continue
                try:
                    st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
                except FileNotFoundError:
                    continue  # deleted while listing
                if stat.S_ISREG(st.st_mode):
                    found.append(ObjectInfo(key, st.st_size))
        return sorted(found, key=lambda o: o.key)

    def delete(self, key: str) -> None:
        dirs, name = self._parts(key)
        with _translated(f"cannot delete {key!r} from {self.root}"):
            try:
                with opened_path(self.root, dirs) as fds:
                    os.unlink(name, dir_fd=fds[-1])
                    for parent, below in zip(reversed(fds[:-1]), reversed(dirs), strict=True):
                        try:  # keep the tree free of empty directories
                            os.rmdir(below, dir_fd=parent)
                        except OSError:
                            break
            except FileNotFoundError:
                pass
