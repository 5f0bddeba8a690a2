"""Inside the training process: whole-state capture/restore, bit-for-bit resume, atomic
checksummed checkpoints, retention, background saves and the checkpoint interval.

Imports no cloud SDK (a test enforces it), so the training process stays lean.
"""

from __future__ import annotations

from spotwise.checkpoint.read import CheckpointInfo
from spotwise.checkpoint.retention import RetentionPolicy, retain
from spotwise.runtime.commit import (
    LoadedCheckpoint,
    list_checkpoints,
    load_checkpoint,
    load_newest_valid,
    verify_checkpoint,
    write_checkpoint,
)
from spotwise.runtime.config import CheckpointConfig
from spotwise.runtime.interval import young_daly_interval_s
from spotwise.runtime.run import EXIT_INTERRUPTED, Mirror, Run

__all__ = [
    "EXIT_INTERRUPTED",
    "CheckpointConfig",
    "CheckpointInfo",
    "LoadedCheckpoint",
    "Mirror",
    "RetentionPolicy",
    "Run",
    "list_checkpoints",
    "load_checkpoint",
    "load_newest_valid",
    "retain",
    "verify_checkpoint",
    "write_checkpoint",
    "young_daly_interval_s",
]
