"""Checkpoint settings: one typed, validated value instead of eleven loose ``Run`` keywords.

``Run`` takes ``checkpoint=CheckpointConfig(...)``; its deprecated flat keywords (``every=``,
``keep_last=``..., :mod:`spotwise.runtime.keywords`) and a framework callback's end here too, so
there is one place that checks them.
The config itself reads no environment variables: :meth:`CheckpointConfig.with_environment`
is the single edge where ``SPOTWISE_MTBI_S`` / ``SPOTWISE_NOTICE_MARGIN_S`` fill what the
caller left unset, so a config built in a test or a library means the same on every machine.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spotwise import settings
from spotwise.checkpoint.retention import RetentionPolicy
from spotwise.errors import ConfigError
from spotwise.runtime.interval import (
    DEFAULT_MTBI_S,
    DEFAULT_NOTICE_MARGIN_S,
    Schedule,
    parse_every,
)

if TYPE_CHECKING:  # the saver imports this module
    from spotwise.runtime.saver.single import Mirror


@dataclass(frozen=True)
class CheckpointConfig:
    """When to save, what to keep, and the timing model behind ``every="auto"``.

    ``mtbi_s`` / ``notice_margin_s`` left as None take the environment's value (see the module
    docstring), then the defaults of :mod:`spotwise.runtime.interval`. Where saves go besides
    the run directory is here too: ``local_dir``, the local staging directory of an ``s3://``
    (or other object store) run directory, and ``mirror``, an object that copies each local
    checkpoint elsewhere (docs/runtime.md).
    """

    every: int | str | None = "auto"
    keep_last: int = 3
    keep_best: int = 0
    best_metric: str | None = None
    best_mode: str = "min"
    keep_every: int | None = None
    async_save: bool = True
    mtbi_s: float | None = None
    notice_margin_s: float | None = None
    local_dir: str | os.PathLike[str] | None = None
    mirror: Mirror | None = field(default=None, compare=False)
    schedule: Schedule = field(init=False, repr=False, compare=False)
    retention: RetentionPolicy = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "schedule", parse_every(self.every))
        try:
            retention = RetentionPolicy(
                self.keep_last, self.keep_best, self.best_metric, self.best_mode, self.keep_every
            )
        except ValueError as exc:
            raise ConfigError(f"invalid retention settings: {exc}") from exc
        object.__setattr__(self, "retention", retention)
        mtbi, margin = self.mtbi_s, self.notice_margin_s
        if mtbi is not None and not (_is_number(mtbi) and 0 < mtbi < math.inf):
            raise ConfigError(f"mtbi_s must be a positive number of seconds, got {mtbi!r}")
        if margin is not None and not (_is_number(margin) and margin >= 0):
            raise ConfigError(
                f"notice_margin_s must be a non-negative number of seconds, got {margin!r}"
            )

    @property
    def mtbi(self) -> float:
        return float(self.mtbi_s if self.mtbi_s is not None else DEFAULT_MTBI_S)

    @property
    def notice_margin(self) -> float:
        margin = self.notice_margin_s
        return float(margin if margin is not None else DEFAULT_NOTICE_MARGIN_S)

    def with_environment(self, environ: Mapping[str, str]) -> CheckpointConfig:
        """This config with unset timing values taken from ``environ`` (the process's edge)."""
        filled: dict[str, Any] = {}
        for key, setting in (
            ("mtbi_s", settings.MTBI_S),
            ("notice_margin_s", settings.NOTICE_MARGIN_S),
        ):
            value = setting.seconds(environ) if getattr(self, key) is None else None
            if value is not None:
                filled[key] = value
        return dataclasses.replace(self, **filled) if filled else self


def checkpoint_config(
    given: CheckpointConfig | None, keywords: Mapping[str, Any]
) -> CheckpointConfig:
    """The config from ``checkpoint=`` or from ``Run``'s own keywords, not both: two sources
    for one setting would leave the reader guessing which one wins. A keyword still at its
    default counts as not given."""
    defaults = CheckpointConfig()
    changed = sorted(k for k, v in keywords.items() if v != getattr(defaults, k))
    if given is None:
        return CheckpointConfig(**keywords)
    if not isinstance(given, CheckpointConfig):
        raise ConfigError(
            f"checkpoint={given!r} is not a CheckpointConfig",
            hint="pass spotwise.CheckpointConfig(every=..., keep_last=...)",
        )
    if changed:
        raise ConfigError(
            "pass checkpoint settings either in checkpoint= or as Run keywords, not both "
            f"(also given: {', '.join(changed)})",
            hint="move them into CheckpointConfig(...)",
        )
    return given


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
