"""The one retry policy: how long to wait before trying a failed call again.

Exponential backoff with full jitter (the shape AWS recommends for every client): the object
stores, the providers' control-plane calls and any other caller of a remote service wait by it,
with ``rand`` injected so the decision stays a pure function.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from spotwise.errors import ConfigError


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter (the AWS-recommended shape)."""

    max_attempts: int = 8
    base_delay_s: float = 0.2
    max_delay_s: float = 10.0

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RetryPolicy:
        """Defaults, with ``AWS_MAX_ATTEMPTS`` honoured as the AWS SDKs do."""
        value = (os.environ if env is None else env).get("AWS_MAX_ATTEMPTS")
        if not value:
            return cls()
        try:
            attempts = int(value)
        except ValueError:
            attempts = 0
        if attempts < 1:
            raise ConfigError(
                f"AWS_MAX_ATTEMPTS={value!r} is not a positive integer",
                hint="unset it or use e.g. AWS_MAX_ATTEMPTS=8",
            )
        return cls(max_attempts=attempts)

    def delay_s(self, attempt: int, rand: float) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based); ``rand`` in [0, 1)."""
        return rand * min(self.max_delay_s, self.base_delay_s * (2 ** (attempt - 1)))
