"""Run's keywords for a framework's callback (Lightning, the Transformers Trainer)."""

from __future__ import annotations

from typing import Any

from spotwise.errors import ConfigError

# the framework owns these objects and the run's length: naming them again would be a second truth
_OWNED = ("state", "model", "optimizer", "scheduler", "scaler", "loader", "steps")


def callback_run_options(
    every: int | str | None, keep_last: int, options: dict[str, Any]
) -> dict[str, Any]:
    """``Run``'s keywords for a callback's one Run; the ones the framework owns are refused."""
    for key in _OWNED:
        if key in options:
            raise ConfigError(
                f"SpotwiseCallback takes no {key}=: it checkpoints the Trainer's own objects",
                hint=f"remove {key}= from SpotwiseCallback(...)",
            )
    return {"every": every, "keep_last": keep_last, **options}
