"""The memory a load reads into: huge pages only where the host does not take freed memory back
(there a huge page costs about 20 times its small pages to fault in again)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from spotwise.checkpoint.memory import fresh_region, huge_pages_pay, reports_free_memory
from spotwise.runtime.commit import fresh_buffer

MiB = 1 << 20


def balloon(root: Path, *features: str) -> Path:
    """A sysfs driver folder as the kernel lays it out: its bound devices, with the features
    each negotiated, beside the driver's own files."""
    driver = root / "virtio_balloon"
    driver.mkdir()
    for name in ("bind", "unbind", "uevent"):
        (driver / name).write_text("")
    for number, bits in enumerate(features):
        device = driver / f"virtio{number}"
        device.mkdir()
        (device / "features").write_text(bits + "\n")
    return driver


# the features of a Firecracker balloon with free page reporting (bits 1, 2 and 5 set)
REPORTING = "011001010000000000000000000000001" + "0" * 95
NOT_REPORTING = "011000010000000000000000000000001" + "0" * 95


def test_a_balloon_that_reports_free_memory_is_recognised(tmp_path: Path) -> None:
    assert reports_free_memory(balloon(tmp_path, REPORTING))


def test_one_reporting_device_among_others_is_enough(tmp_path: Path) -> None:
    assert reports_free_memory(balloon(tmp_path, NOT_REPORTING, REPORTING))


@pytest.mark.parametrize("features", [NOT_REPORTING, "01100", "", "\n"])
def test_a_balloon_without_the_reporting_bit_is_not(tmp_path: Path, features: str) -> None:
    assert not reports_free_memory(balloon(tmp_path, features))


def test_no_balloon_or_an_unreadable_one_is_not(tmp_path: Path) -> None:
    assert not reports_free_memory(tmp_path / "absent")
    assert not reports_free_memory(balloon(tmp_path))  # the driver loaded, no device bound
    unreadable = tmp_path / "other"
    (unreadable / "virtio0").mkdir(parents=True)  # a device without a features file
    assert not reports_free_memory(unreadable)


def vm_flags(address: int) -> list[str]:
    """The kernel's flags of the mapping holding ``address`` (``hg``: advised huge pages)."""
    current = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(part, 16) for part in head.split("-"))
            current = start <= address < end
        elif current and head == "VmFlags:":
            return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


def test_a_fresh_region_takes_huge_pages_exactly_where_they_pay() -> None:
    assert huge_pages_pay() == (not reports_free_memory())  # this machine's own balloon
    region = fresh_region(64 * MiB)
    address = ctypes.addressof(ctypes.c_char.from_buffer(region))
    assert ("hg" in vm_flags(address)) == huge_pages_pay()
    assert region[:4096] == bytes(4096) and region[-1] == 0  # zero-filled by the kernel
    region.close()


def test_a_large_read_buffer_is_such_a_region_and_a_small_one_is_not() -> None:
    large = fresh_buffer(64 * MiB, zeroed=True)
    assert ("hg" in vm_flags(large.data_ptr())) == huge_pages_pay()
    assert not large.any()
    small = fresh_buffer(4096, zeroed=True)
    assert "hg" not in vm_flags(small.data_ptr()) and not small.any()
