"""``local``: each attempt is a supervised process on this machine (the embedded default).

Nothing takes the machine away, so attempts end only by themselves or by ``terminate``; it is
what ``spotwise launch`` uses when a job file names no provider.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pydantic import Field

from spotwise.control.providers.base import (
    Features,
    Handle,
    LaunchRequest,
    Options,
    Prices,
    parse_options,
)
from spotwise.control.providers.process import ProcessBacked, ProcessMachines

if TYPE_CHECKING:
    from spotwise.control.resources import Resources


class LocalOptions(Options):
    usd_per_hour: float = Field(default=0.0, ge=0)


class LocalProvider(ProcessBacked):
    name = "local"
    Options = LocalOptions

    def __init__(
        self,
        options: dict[str, Any],
        *,
        epoch: float,
        instance_type: str | None,
        preflight: bool = False,
        resources: Resources | None = None,
    ):
        opts = parse_options(LocalOptions, self.name, options)
        # a local process is on no cloud: the runtime must never probe metadata endpoints
        self.features = Features(
            zones=("local",), spot=False, multi_node=True, poll_s=0.05, platform="none"
        )
        self.prices = Prices.flat(self.features.zones, opts.usd_per_hour)
        self._machines = ProcessMachines(settle_s=self.features.grace_s)

    def launch(self, req: LaunchRequest) -> Handle:
        """One process, or one torch launcher per node meeting on 127.0.0.1."""
        banner = f"attempt {req.n} on local"
        return self._machines.launch_nodes(
            req,
            [
                {"banner": f"{banner} node {k}/{req.nodes}" if req.nodes > 1 else banner}
                for k in range(req.nodes)
            ],
        )
