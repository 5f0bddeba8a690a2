"""Joining CRC32Cs of consecutive pieces, so that pieces read on different threads can each be
checksummed while still in the CPU's cache instead of in a second pass over the whole buffer.

Appending ``n`` bytes to a message changes its CRC's register by a fixed linear map (over GF(2))
that depends only on ``n``, so ``crc(A + B) == after(crc(A)) ^ crc(B)`` for every ``B`` of length
``n``. The map is found, once per length, as the change that ``n`` zero bytes make to each
single-bit register (the initial and final inversions of CRC32C cancel in that difference).
"""

from __future__ import annotations

import functools

import crc32c


@functools.cache
def _columns(length: int) -> tuple[int, ...]:
    """The map of appending ``length`` bytes, as the images of the 32 single-bit registers:
    33 checksums of ``length`` zero bytes (about 20 ms for 16 MiB, once per process)."""
    zeros = bytes(length)
    base = crc32c.crc32c(zeros)
    return tuple(crc32c.crc32c(zeros, 1 << bit) ^ base for bit in range(32))


def join(crc_a: int, crc_b: int, length_b: int) -> int:
    """The CRC32C of ``A + B`` from the CRC32Cs of ``A`` and of ``B`` (``length_b`` bytes)."""
    columns = _columns(length_b)
    for bit in range(32):
        if crc_a >> bit & 1:
            crc_b ^= columns[bit]
    return crc_b
