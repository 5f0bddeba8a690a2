"""Run's keywords for a framework's callback (Lightning, the Transformers Trainer)."""

from __future__ import annotations

from typing import Any

from spotwise.errors import ConfigError
from spotwise.runtime.config import checkpoint_config
from spotwise.runtime.keywords import CHECKPOINT_FIELDS

# the framework owns these objects and the run's length: naming them again would be a second truth
_OWNED = ("state", "model", "optimizer", "scheduler", "scaler", "loader", "steps")


def callback_run_options(
    every: int | str | None, keep_last: int, options: dict[str, Any]
) -> dict[str, Any]:
    """``Run``'s keywords for a callback's one Run; the ones the framework owns are refused.
    The callback's checkpoint settings (``every=``, ``keep_last=``, any other field of
    ``CheckpointConfig``) become one ``checkpoint=``."""
    for key in _OWNED:
        if key in options:
            raise ConfigError(
                f"SpotwiseCallback takes no {key}=: it checkpoints the Trainer's own objects",
                hint=f"remove {key}= from SpotwiseCallback(...)",
            )
    rest = {k: v for k, v in options.items() if k not in CHECKPOINT_FIELDS}
    fields = {k: v for k, v in options.items() if k in CHECKPOINT_FIELDS}
    given = rest.pop("checkpoint", None)
    config = checkpoint_config(given, {"every": every, "keep_last": keep_last, **fields})
    return {**rest, "checkpoint": config}
