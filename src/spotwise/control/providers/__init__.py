"""Providers by name: where attempts run. Adding one is a file plus one line here (or an entry
point in the ``spotwise.providers`` group of another package)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spotwise.registry import Entry, Registry

if TYPE_CHECKING:
    from spotwise.control.providers.base import (
        AttemptStatus,
        Features,
        Handle,
        LaunchRequest,
        NoticeKind,
        Options,
        Phase,
        Placement,
        Prices,
        Pricing,
        Provider,
        parse_options,
    )
    from spotwise.control.resources import Resources

# The protocol's names, loaded from ``base`` on first use (PEP 562): a ``notice: aws`` sim
# machine's wrapper (``providers.machine``, one process per attempt) imports this package, and
# must not pay for pydantic at every launch.
_BASE = "spotwise.control.providers.base"
_FROM_BASE = {
    "AttemptStatus",
    "Features",
    "Handle",
    "LaunchRequest",
    "NoticeKind",
    "Options",
    "Phase",
    "Placement",
    "Prices",
    "Pricing",
    "Provider",
    "parse_options",
}

PROVIDERS: Registry[Any] = Registry(
    "provider",
    {
        "aws": Entry("spotwise.control.providers.aws:AwsProvider", "aws"),
        "azure": Entry("spotwise.control.providers.azure:AzureProvider", "azure"),
        "fake": "spotwise.control.providers.fake:FakeProvider",
        "gcp": Entry("spotwise.control.providers.gcp:GcpProvider", "gcp"),
        "kubernetes": Entry(
            "spotwise.control.providers.kubernetes:KubernetesProvider", "kubernetes"
        ),
        "local": "spotwise.control.providers.local:LocalProvider",
        "sim": "spotwise.control.providers.sim:SimProvider",
        "slurm": "spotwise.control.providers.slurm:SlurmProvider",
    },
    group="spotwise.providers",
)


def check_options(name: str, options: dict[str, Any]) -> None:
    """Validate a job file's provider name and options against that provider's ``Options``."""
    from spotwise.control.providers.base import parse_options

    parse_options(PROVIDERS.load(name).Options, name, options)


def make_provider(
    name: str,
    options: dict[str, Any],
    *,
    epoch: float,
    instance_type: str | None = None,
    preflight: bool = False,
    resources: Resources | None = None,
) -> Provider:
    """A provider object for one job (``epoch``: the job's creation time, the sim's clock 0).

    ``preflight``: also check that it is reachable with these settings (at submit time).
    ``resources``: what one machine must have (a provider that requests GPUs needs the count)."""
    provider: Provider = PROVIDERS.load(name)(
        options, epoch=epoch, instance_type=instance_type, preflight=preflight, resources=resources
    )
    return provider


def __getattr__(name: str) -> Any:
    if name not in _FROM_BASE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_BASE), name)
    globals()[name] = value
    return value


__all__ = [
    "PROVIDERS",
    "AttemptStatus",
    "Features",
    "Handle",
    "LaunchRequest",
    "NoticeKind",
    "Options",
    "Phase",
    "Placement",
    "Prices",
    "Pricing",
    "Provider",
    "check_options",
    "make_provider",
    "parse_options",
]
