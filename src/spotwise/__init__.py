"""spotwise: train on interruptible GPUs without losing work.

The public API is deliberately small. Names are resolved lazily (PEP 562) so that
``import spotwise`` and ``spotwise --help`` do not pull in torch; ``spotwise.Run`` does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_EXPORTS = {
    # runtime: exact-resume checkpoints inside the training loop
    "Run": "spotwise.runtime",
    "CheckpointConfig": "spotwise.runtime",
    "EXIT_INTERRUPTED": "spotwise.runtime",
    # storage: where checkpoints live
    "Storage": "spotwise.storage",
    "open_storage": "spotwise.storage",
    # notices: the platform's warning that the machine goes away
    "Notice": "spotwise.notices",
    "NoticeKind": "spotwise.notices",
    "watch_from_environment": "spotwise.notices.watcher",
    # market: where to run and what it will really cost
    "JobRequest": "spotwise.market",
    "Placement": "spotwise.market",
    "advise_from_catalog": "spotwise.market",
    "load_catalog": "spotwise.market",
    "load_interruption_model": "spotwise.market",
    # errors
    "SpotwiseError": "spotwise.errors",
}

__all__ = [
    "EXIT_INTERRUPTED",
    "CheckpointConfig",
    "JobRequest",
    "Notice",
    "NoticeKind",
    "Placement",
    "Run",
    "SpotwiseError",
    "Storage",
    "__version__",
    "advise_from_catalog",
    "load_catalog",
    "load_interruption_model",
    "open_storage",
    "watch_from_environment",
]

if TYPE_CHECKING:
    from spotwise.errors import SpotwiseError
    from spotwise.market import (
        JobRequest,
        Placement,
        advise_from_catalog,
        load_catalog,
        load_interruption_model,
    )
    from spotwise.notices import Notice, NoticeKind
    from spotwise.notices.watcher import watch_from_environment
    from spotwise.runtime import EXIT_INTERRUPTED, CheckpointConfig, Run
    from spotwise.storage import Storage, open_storage


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spotwise' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
