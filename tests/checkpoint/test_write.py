"""The durable writer: its bytes and CRC, and the writeback hint it gives the kernel per batch."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import crc32c
import pytest

from spotwise.checkpoint import durable
from spotwise.checkpoint.durable import start_writeback
from spotwise.checkpoint.write import write_file


def test_write_file_has_every_byte_and_their_crc(tmp_path: Path) -> None:
    chunks = [os.urandom(3 << 20), b"", memoryview(os.urandom(5 << 20)), b"tail"]
    opened: list[int] = []
    entry = write_file(tmp_path / "f", chunks, opened, sync=True)
    durable.close_all(opened)
    data = (tmp_path / "f").read_bytes()
    assert data == b"".join(bytes(c) for c in chunks)
    assert entry == {"size": len(data), "crc32c": f"{crc32c.crc32c(data):08x}"}


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
