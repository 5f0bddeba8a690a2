"""The durable writer: its bytes and CRC, through the page cache (with the writeback hint it
gives the kernel per batch) and, for large files, directly to the disk."""

from __future__ import annotations

import errno
import fcntl
import os
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path

import crc32c
import pytest

from spotwise.checkpoint import durable
from spotwise.checkpoint.durable import start_writeback
from spotwise.checkpoint.write import _DIRECT_MIN, _STAGE, _STAGES, write_file

MiB = 1 << 20


def test_write_file_has_every_byte_and_their_crc(tmp_path: Path) -> None:
    chunks = [os.urandom(3 << 20), b"", memoryview(os.urandom(5 << 20)), b"tail"]
    opened: list[int] = []
    entry = write_file(tmp_path / "f", chunks, opened, sync=True)
    durable.close_all(opened)
    data = (tmp_path / "f").read_bytes()
    assert data == b"".join(bytes(c) for c in chunks)
    assert entry == {"size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}


def direct_io_works(beside: Path) -> bool:
    """Whether the file system of file ``beside`` takes direct I/O (tmpfs before Linux 6.6,
    some FUSE and network file systems do not: there the writer keeps to the page cache)."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    probe = beside.with_name(f".probe-{beside.name}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | flag)
    except OSError as exc:
        assert exc.errno == errno.EINVAL
        return False
    os.close(fd)
    probe.unlink()
    return True


def write_and_check(path: Path, chunks: list[bytes | memoryview]) -> None:
    opened: list[int] = []
    try:
        entry = write_file(path, chunks, opened)
        direct = bool(fcntl.fcntl(opened[0], fcntl.F_GETFL) & getattr(os, "O_DIRECT", 0))
    finally:
        durable.close_all(opened)
    assert direct == direct_io_works(path)
    data = b"".join(bytes(c) for c in chunks)
    assert path.read_bytes() == data  # no padding left past the true end, no byte moved
    assert entry == {"size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}


@pytest.mark.parametrize(
    "sizes",
    [
        [_DIRECT_MIN],  # the smallest file written directly: whole staging buffers
        [_DIRECT_MIN + 1, 5, 0, 3 * MiB],  # a tail of one byte and a file that is no whole block
        [7 * 1024 + 3] * 1500,  # small pieces, each buffer cut inside one of them
        [(_STAGES + 1) * _STAGE + 4096],  # more than the buffers hold: each is reused
    ],
    ids=["whole-buffers", "odd-tail", "small-pieces", "buffers-reused"],
)
def test_a_large_file_goes_directly_to_the_disk_with_every_byte(
    tmp_path: Path, sizes: list[int]
) -> None:
    write_and_check(tmp_path / "f", [memoryview(os.urandom(n)) for n in sizes])


def test_concurrent_large_writers_each_write_their_own_bytes(tmp_path: Path) -> None:
    """A save's writers run at once; each has staging buffers of its own."""
    contents = [[os.urandom(2 * _STAGE + 1000 * i + 1)] for i in range(4)]
    with ThreadPoolExecutor(4) as pool:
        for done in [
            pool.submit(write_and_check, tmp_path / f"f{i}", c) for i, c in enumerate(contents)
        ]:
            done.result()


def test_a_failed_large_write_raises_and_the_next_one_is_whole(
    tmp_path: Path, file_size_limit: Callable[[int], AbstractContextManager[None]]
) -> None:
    """The error reaches the save (which names it to the user), nothing waits forever, and
    the buffers a failed write used serve the next save intact."""
    chunks: list[bytes | memoryview] = [os.urandom(3 * _STAGE)]
    opened: list[int] = []
    with file_size_limit(2 * _STAGE), pytest.raises(OSError) as info:
        write_file(tmp_path / "f", chunks, opened)
    durable.close_all(opened)
    assert info.value.errno == errno.EFBIG
    write_and_check(tmp_path / "g", chunks)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sync_file_range is Linux's")
def test_writeback_hint_is_bound_on_linux() -> None:
    """Without the binding every save silently loses its head start on the disk."""
    assert durable._sync_file_range() is not None


def test_writeback_hint_never_fails_a_save(tmp_path: Path) -> None:
    """A hint the kernel refuses (a pipe, a closed descriptor) changes nothing."""
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"x")
        start_writeback(write_end, 0, 1)
    finally:
        os.close(read_end)
        os.close(write_end)
    start_writeback(write_end, 0, 1)  # closed now: EBADF, ignored
    path = tmp_path / "f"
    path.write_bytes(b"y" * 4096)
    fd = os.open(path, os.O_RDWR)
    try:
        start_writeback(fd, 0, 4096)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"y" * 4096
