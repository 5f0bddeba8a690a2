"""How a Run saves, chosen once, when it starts: alone (with an optional second tier behind the
local directory) or as one rank of a torchrun job (into a shared directory or the object store).
See :mod:`spotwise.runtime.saver.base` for the interface."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from spotwise.errors import ConfigError
from spotwise.runtime import distributed
from spotwise.runtime.config import CheckpointConfig
from spotwise.runtime.saver.base import EARLY_SAVE, EXIT, NOTHING, Saver, SaveStats, smooth
from spotwise.runtime.saver.single import Mirror, SingleSaver
from spotwise.runtime.tiered import TieredMirror
from spotwise.telemetry.events import EventLog


def open_saver(
    run_dir: Path,
    remote_uri: str | None,
    *,
    ranks: distributed.Ranks | None,
    config: CheckpointConfig,
    events: EventLog,
    state: Mapping[str, Any],
) -> Saver:
    """The saver for this process: the one place that tells the three ways of saving apart."""
    if ranks is not None:  # imported only here: it imports DCP
        from spotwise.runtime.saver.distributed import DistributedSaver

        return DistributedSaver(run_dir, config, events, ranks, state, remote_uri)
    mirror = config.mirror
    if remote_uri is not None:  # two tiers: commit locally, upload in the background
        if mirror is not None:
            raise ConfigError("pass either a remote run_dir or mirror=, not both")
        mirror = TieredMirror.from_uri(remote_uri, retention=config.retention)
    return SingleSaver(run_dir, config, events, mirror)


__all__ = [
    "EARLY_SAVE",
    "EXIT",
    "NOTHING",
    "Mirror",
    "SaveStats",
    "Saver",
    "open_saver",
    "smooth",
]
