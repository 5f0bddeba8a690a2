"""Whether a save's large files go to the disk directly (``O_DIRECT``) or through the page cache,
chosen by how fast each way wrote this Run's earlier saves.

Neither way is faster everywhere, and no rule read from the machine tells them apart:
- on a virtual machine whose host takes freed memory back, 512 MiB written through the page
  cache took about 5 s, against 0.4-0.5 s written directly;
- on another, two ranks saving 512 MiB each were faster through the page cache in 10 saves
  of 10 (median 2.64 s against 3.23 s), while one process writing 1 GiB in four files was
  faster directly in 7 of 8.

So each kind of save keeps its own :class:`WriteWay` and measures, in memory only (a resumed
run may be on another machine). Pure: the caller times the writes and passes the figures in.
"""

from __future__ import annotations

import statistics
from collections import deque

DIRECT, PAGE_CACHE = "direct", "page cache"  # the ways, as events name them

_GIB = 1 << 30
_MIN_BYTES = 32 << 20  # a smaller save's time is mostly not its writing: it says nothing
_KEEP = 3  # the latest seconds per GiB kept of each way (their median is its speed)
_RETRY = 8  # saves the best way before the other is tried again...
_RETRY_MAX = 64  # ... doubled each time it loses again, up to this


class WriteWay:
    """The way for the next save of one kind (a single process's, a rank's).

    Direct first: it is never far off, and where the host takes memory back it is many times
    faster. The first save that may try the other way after one measured direct goes through
    the page cache; from then on the way with the lower median seconds per GiB of its last
    three saves is taken, and the other tried again after 8 saves, then after twice as many
    each time it loses again (up to 64). A try is judged by its own figure, not by what that
    way measured before: the machine may have changed since. A save that may not try (an
    emergency save on a notice) always takes the best known way."""

    def __init__(self) -> None:
        self._seconds_per_gib: dict[bool, deque[float]] = {
            True: deque(maxlen=_KEEP),
            False: deque(maxlen=_KEEP),
        }
        self._usual = 0  # saves the best way since the other was last tried
        self._wait = _RETRY  # ... before it is tried again

    def direct(self, *, may_try: bool) -> bool:
        """Whether the next save writes directly; ``may_try`` lets it be the one to try the
        way that is not the best known."""
        best = self._best()
        measured = self._seconds_per_gib
        due = not measured[not best] or self._usual >= self._wait
        return not best if may_try and measured[best] and due else best

    def record(self, direct: bool, nbytes: int, seconds: float) -> None:
        """A save written ``direct`` or not took ``seconds`` to make ``nbytes`` durable."""
        if nbytes < _MIN_BYTES:
            return
        best = self._best()
        figures = self._seconds_per_gib[direct]
        if direct == best:
            figures.append(seconds * _GIB / nbytes)
            self._usual += 1
            return
        first = not figures
        figures.clear()
        figures.append(seconds * _GIB / nbytes)
        self._usual = 0
        if self._best() == direct or first:
            self._wait = _RETRY
        else:  # lost again: try it more rarely
            self._wait = min(2 * self._wait, _RETRY_MAX)

    def _best(self) -> bool:
        direct, cached = (self._seconds_per_gib[way] for way in (True, False))
        if not cached:
            return True
        if not direct:
            return False
        return statistics.median(cached) >= statistics.median(direct)


def way_name(direct: bool) -> str:
    return DIRECT if direct else PAGE_CACHE
