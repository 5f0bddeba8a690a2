"""Fresh memory to read a checkpoint file into, faulted in as cheaply as this machine allows.

A load reads each file into new memory, and on a virtual machine the first touch of each page
can cost as much as the disk read. Transparent huge pages cut the faults 512-fold, and where the
memory stays with the machine they make them negligible (256 MiB faulted in at about 1.3 GB/s
without them on one machine; 1 GiB in 0.11 s with them against 0.5 s without on another). But
where a virtio balloon reports free memory back to its host (free page reporting), a huge page
of memory the host took back costs about 20 times its 512 small pages (1 GiB: 9.4-10 s with
them, 0.76-0.86 s without, after 8 s idle), which would make a load of tens of GiB take minutes.
So the advice is given only where free memory is not handed back. A machine with a GPU passed
through pins its memory for the device, so GPU machines keep the advice.
"""

from __future__ import annotations

import functools
import mmap
from pathlib import Path

BALLOON_DRIVER = Path("/sys/bus/virtio/drivers/virtio_balloon")
_REPORTING = 5  # VIRTIO_BALLOON_F_REPORTING: the feature bit of free page reporting


def reports_free_memory(driver: Path = BALLOON_DRIVER) -> bool:
    """Whether a virtio balloon bound to ``driver`` (its sysfs folder) negotiated free page
    reporting: each device's ``features`` file is one character per feature bit, lowest
    first. Anything unreadable counts as no."""
    try:
        devices = [d for d in driver.iterdir() if d.name.startswith("virtio")]
        return any(_bit((d / "features").read_text(), _REPORTING) for d in devices)
    except OSError:
        return False


def _bit(features: str, bit: int) -> bool:
    features = features.strip()
    return len(features) > bit and features[bit] == "1"


@functools.cache
def huge_pages_pay() -> bool:
    """Whether fresh read buffers are advised to use transparent huge pages on this machine."""
    return hasattr(mmap, "MADV_HUGEPAGE") and not reports_free_memory()


def fresh_region(size: int) -> mmap.mmap:
    """``size`` bytes of private anonymous memory (zero-filled by the kernel), advised to use
    huge pages where :func:`huge_pages_pay`."""
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if huge_pages_pay():
        region.madvise(mmap.MADV_HUGEPAGE)
    return region
