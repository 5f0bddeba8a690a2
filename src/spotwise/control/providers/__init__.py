"""Providers by name: where attempts run. Adding one is a file plus one line here."""

from __future__ import annotations

from typing import Any

from spotwise.control.providers.base import (
    AttemptStatus,
    Features,
    Handle,
    LaunchRequest,
    Phase,
    Placement,
    Pricing,
    Provider,
)
from spotwise.registry import Registry

PROVIDERS: Registry[Any] = Registry(
    "provider",
    {
        "local": "spotwise.control.providers.local:LocalProvider",
        "sim": "spotwise.control.providers.sim:SimProvider",
        "slurm": "spotwise.control.providers.slurm:SlurmProvider",
    },
)


def make_provider(name: str, options: dict[str, Any], *, epoch: float,
                  instance_type: str | None = None) -> Provider:
    """A provider object for one job (``epoch``: the job's creation time, the sim's clock 0)."""
    provider: Provider = PROVIDERS.load(name)(options, epoch=epoch, instance_type=instance_type)
    return provider


__all__ = ["PROVIDERS", "AttemptStatus", "Features", "Handle", "LaunchRequest", "Phase",
           "Placement", "Pricing", "Provider", "make_provider"]
