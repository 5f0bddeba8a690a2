"""Opening, removing and renaming entries of a run directory without following links out of it.

A run directory may be shared or planted with links (``step-00000070 -> /elsewhere``,
``events.jsonl -> ~/.bashrc``). Every operation on an entry therefore goes through a descriptor
of the directory that holds it and names the entry relative to it with ``O_NOFOLLOW`` (or
``follow_symlinks=False``): a link is opened as nothing, removed or renamed as the link itself,
and never resolved. Only the run directory itself, the path the user gave, is opened as named.
Linux semantics (``O_NOFOLLOW``, ``O_DIRECTORY``, ``dir_fd=``). Torch-free, so the event log
and the controller's readers use it too; the one place those flags are spelled.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC  # for every entry opened relative to a directory


def open_dir(path: str | os.PathLike[str], *, follow: bool = True) -> int:
    """A descriptor of directory ``path``. ``follow`` (for the run directory the user named)
    resolves links in it; without it a link as the last component is refused (ELOOP)."""
    return os.open(path, _DIR if follow else _DIR | os.O_NOFOLLOW)


@contextmanager
def opened_dir(path: str | os.PathLike[str], *, follow: bool = True) -> Iterator[int]:
    fd = open_dir(path, follow=follow)
    try:
        yield fd
    finally:
        os.close(fd)


def open_subdir(dir_fd: int, name: str) -> int:
    """Directory ``name`` inside ``dir_fd``; ELOOP or ENOTDIR if it is a link or no directory."""
    return os.open(name, _DIR | os.O_NOFOLLOW, dir_fd=dir_fd)


def open_entry(dir_fd: int, name: str, flags: int, mode: int = 0o644) -> int:
    """File ``name`` inside ``dir_fd`` with ``flags``, never through a link (ELOOP)."""
    return os.open(name, flags | NOFOLLOW, mode, dir_fd=dir_fd)


def entry_mode(dir_fd: int, name: str) -> int | None:
    """The type and mode of entry ``name`` itself (a link is not followed), None if absent."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
    except FileNotFoundError:
        return None


def remove_entry(dir_fd: int, name: str) -> None:
    """Remove entry ``name`` of ``dir_fd``: a link or file is unlinked itself, a directory is
    emptied through its own descriptor (opened with ``O_NOFOLLOW``) and removed, so no link
    inside it is followed either. Absent is fine."""
    mode = entry_mode(dir_fd, name)
    if mode is None:
        return
    if not stat.S_ISDIR(mode):
        with suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return
    fd = open_subdir(dir_fd, name)
    try:
        with os.scandir(fd) as entries:
            names = [entry.name for entry in entries]
        for inner in names:
            remove_entry(fd, inner)
    finally:
        os.close(fd)
    with suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=dir_fd)


def remove_path(path: Path) -> None:
    """:func:`remove_entry` of ``path``'s last component, inside its (followed) parent."""
    with opened_dir(path.parent) as parent:
        remove_entry(parent, path.name)


def rename_entry(dir_fd: int, source: str, target: str) -> None:
    """Rename an entry within one directory; a link is renamed itself, never its target."""
    os.rename(source, target, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


@contextmanager
def opened_path(
    root: str | os.PathLike[str], parts: list[str], *, create: bool = False
) -> Iterator[list[int]]:
    """Descriptors of ``root`` and of each directory ``parts`` names below it, in order, each
    opened relative to the one before without following a link (made first if ``create``):
    how a '/'-separated key under a storage root is reached without leaving the root."""
    fds = [open_dir(root)]
    try:
        for part in parts:
            if create:
                with suppress(FileExistsError):
                    os.mkdir(part, dir_fd=fds[-1])
            fds.append(open_subdir(fds[-1], part))
        yield fds
    finally:
        for fd in reversed(fds):
            os.close(fd)
