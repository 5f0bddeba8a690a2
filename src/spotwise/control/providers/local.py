"""``local``: each attempt is a supervised process on this machine (the embedded default).

Nothing takes the machine away, so attempts end only by themselves or by ``terminate``; it is
what ``spotwise launch`` uses when a job file names no provider.
"""

from __future__ import annotations

from typing import Any

from spotwise.control.providers.base import (
    Features,
    Handle,
    LaunchRequest,
    Placement,
    Pricing,
)
from spotwise.control.providers.process import ProcessBacked, ProcessMachines
from spotwise.errors import ConfigError


class LocalProvider(ProcessBacked):
    name = "local"

    def __init__(self, options: dict[str, Any], *, epoch: float, instance_type: str | None):
        unknown = set(options) - {"usd_per_hour"}
        if unknown:
            raise ConfigError(f"provider.local: unknown option(s) {sorted(unknown)}",
                              hint="allowed: usd_per_hour")
        self.usd_per_hour = float(options.get("usd_per_hour", 0.0))
        self.features = Features(spot=False, zones=("local",), poll_s=0.05)
        self._machines = ProcessMachines()

    def check(self) -> None:
        """A local process can always be started."""

    def pricing(self, placement: Placement) -> Pricing:
        return Pricing(self.usd_per_hour, self.usd_per_hour, 1.0)

    def launch(self, req: LaunchRequest) -> Handle:
        return self._machines.launch(req, banner=f"attempt {req.n} on local")
