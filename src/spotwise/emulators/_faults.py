"""The one fault model of the emulators: what to answer instead of serving, for how many
requests, and which requests; and a rate limit that answers 429 above a request rate.

Each emulator names its own answers (an HTTP status, ``"hang"``, ``ZONE_RESOURCE_POOL_EXHAUSTED``,
``SkuNotAvailable``, a proxy's ``"reset"``) and the request fields it matches on (``path``,
``operation``, ``zone``...); the counting and matching live here once. The caller holds its own
lock around :func:`take` and :meth:`RateLimit.admit`.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar


@dataclass
class Fault:
    """Answer ``what`` to the next ``times`` requests (every one when None) whose fields the
    regular expressions in ``where`` find (``re.search``: a plain substring finds itself, and
    ``-1$`` picks a rank 1 by its name; a missing or empty pattern matches all)."""

    what: str
    times: int | None = 1
    where: dict[str, str] = field(default_factory=dict)
    hits: int = 0

    def applies(self, fields: Mapping[str, str]) -> bool:
        left = self.times is None or self.hits < self.times
        return left and all(
            re.search(pattern, fields.get(key, "")) for key, pattern in self.where.items()
        )


F = TypeVar("F", bound=Fault)


def take(faults: Iterable[F], fields: Mapping[str, str]) -> F | None:
    """The first fault that applies to a request with ``fields``, counted as used; None if none."""
    for fault in faults:
        if fault.applies(fields):
            fault.hits += 1
            return fault
    return None


@dataclass
class RateLimit:
    """At most ``per_s`` requests in any ``window_s``; 0 = no limit. The clock is the caller's."""

    per_s: int
    window_s: float = 1.0
    _recent: deque[float] = field(default_factory=deque, repr=False)

    def admit(self, now: float) -> bool:
        """Whether a request at ``now`` is served (counted) rather than throttled."""
        if self.per_s <= 0:
            return True
        while self._recent and now - self._recent[0] > self.window_s:
            self._recent.popleft()
        if len(self._recent) >= self.per_s:
            return False
        self._recent.append(now)
        return True
