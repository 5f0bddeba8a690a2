"""The reader's CRC: chunks read at once, each checksummed by its reader piece by piece, the
chunks' CRCs joined in order. Every split of a file must give the CRC of its bytes."""

from __future__ import annotations

import os
import random
from pathlib import Path

import crc32c
import pytest

from spotwise.checkpoint.crcjoin import join
from spotwise.checkpoint.read import READ_CHUNK, read_with_crc
from spotwise.errors import CorruptCheckpointError


def test_joined_crcs_are_the_crc_of_the_whole() -> None:
    rng = random.Random(7)
    data = rng.randbytes(1 << 16)
    for _ in range(40):
        cut = rng.randrange(len(data) + 1)
        a, b = data[:cut], data[cut:]
        assert join(crc32c.crc32c(a), crc32c.crc32c(b), len(b)) == crc32c.crc32c(data)
    assert join(0x1234ABCD, crc32c.crc32c(b""), 0) == 0x1234ABCD  # nothing appended


@pytest.mark.parametrize(
    "size",
    [0, 1, 300_000, READ_CHUNK, READ_CHUNK + 1, 3 * READ_CHUNK, 5 * READ_CHUNK + 12_345],
    ids=["empty", "one-byte", "pieces", "one-chunk", "chunk-and-a-byte", "chunks", "many+tail"],
)
def test_read_with_crc_fills_the_buffer_and_gives_its_crc(tmp_path: Path, size: int) -> None:
    data = os.urandom(size)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        buf = bytearray(size)
        crc = read_with_crc(fd, memoryview(buf), tmp_path / "f")
    finally:
        os.close(fd)
    assert buf == data
    assert crc == crc32c.crc32c(data)


def test_a_file_shorter_than_its_entry_is_refused(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(os.urandom(2 * READ_CHUNK + 7))
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        with pytest.raises(CorruptCheckpointError, match="ended early"):
            read_with_crc(fd, memoryview(bytearray(3 * READ_CHUNK)), tmp_path / "f")
    finally:
        os.close(fd)
