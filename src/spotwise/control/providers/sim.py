"""``sim``: local processes on a simulated spot market that replays real availability traces.

Time is compressed: one wall second is ``time_compression`` seconds of trace time, counted from
the job's creation (so a restarted controller sees the same market). A spot attempt in a zone
runs until the trace's next unavailable tick in that zone; ``notice_s`` wall seconds before, the
machine gets the platform's notice (SIGTERM, with ``SPOTWISE_GRACE_S`` set to the notice), and at
that instant the machine is taken away (SIGKILL). With ``notice: aws`` the notice comes instead as
EC2 gives it: ``spot/instance-action`` on a loopback IMDS emulator the job is pointed at.
Launching spot where the trace says no capacity fails with
:class:`~spotwise.errors.CapacityError`, as a cloud's launch does. Attempts are billed in
simulated hours at the market catalog's prices for ``instance_type``.
"""

from __future__ import annotations

import functools
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field

from spotwise.control.pricing import catalog_usd_per_hour, region_of
from spotwise.control.providers.base import (
    MARKETS,
    Features,
    Handle,
    LaunchRequest,
    NoticeKind,
    Options,
    Prices,
    Pricing,
    parse_options,
)
from spotwise.control.providers.process import ProcessBacked, ProcessMachines
from spotwise.errors import CapacityError, ConfigError

if TYPE_CHECKING:
    from spotwise.control.resources import Resources
    from spotwise.market.traces import Trace

NOTICES = {"sigterm": NoticeKind.SIGNAL, "aws": NoticeKind.AWS_IMDS}


class SimOptions(Options):
    trace: str = "aws-02-15-2023-first30d"
    zones: list[str] | None = None
    regions: list[str] | None = None  # the trace's zones in these regions (default: all)
    time_compression: float = Field(default=600.0, gt=0)
    start_hour: float = 0.0
    notice_s: float = Field(default=5.0, ge=0)
    boot_s: float = Field(default=0.3, ge=0)
    spot_usd_per_hour: float | None = Field(default=None, ge=0)
    ondemand_usd_per_hour: float | None = Field(default=None, ge=0)
    # sigterm: SIGTERM then SIGKILL after notice_s; aws: the AWS IMDS spot/instance-action
    # notice from a loopback emulator
    notice: Literal["sigterm", "aws"] = "sigterm"
    # spot machines that one unit of the trace's count stands for: the shipped traces record
    # whether one machine could be had (0 or 1), so a multi-node job replays them as a cluster
    # of this many machines that comes and goes with that capacity
    machines_per_count: int = Field(default=1, ge=1, le=1024)


@dataclass(frozen=True)
class SimMarket:
    """Pure replay of availability traces on a compressed clock (no I/O, time passed in)."""

    zones: tuple[str, ...]
    machines: np.ndarray  # zones x ticks: spot machines available (a bool array means 0 or 1)
    gap_s: float
    compression: float
    epoch: float  # wall time of trace offset ``start_s``
    start_s: float = 0.0

    def tick(self, wall: float) -> int:
        return int((self.start_s + (wall - self.epoch) * self.compression) // self.gap_s)

    def wall_of_tick(self, tick: int) -> float:
        return self.epoch + (tick * self.gap_s - self.start_s) / self.compression

    def is_available(self, zone: str, wall: float, nodes: int = 1) -> bool:
        """Whether ``zone`` has ``nodes`` spot machines at ``wall``."""
        t = self.tick(wall)
        row = self.machines[self.zones.index(zone)]
        return bool(row[t % row.size] >= nodes)

    def loss_wall(self, zone: str, wall: float, nodes: int = 1) -> float | None:
        """When ``zone`` next has fewer than ``nodes`` spot machines, so an attempt holding
        that many loses one (None: not within one trace length)."""
        row = self.machines[self.zones.index(zone)]
        t = self.tick(wall)
        ahead = np.roll(row, -(t % row.size))
        gone = np.flatnonzero(ahead < nodes)
        return None if gone.size == 0 else self.wall_of_tick(t + int(gone[0]))


def _trace(path: Path) -> Trace:
    """The trace file at ``path``, parsed once while it stays the same file: a server builds
    a provider for every job it adopts and every job submitted (measured: reading and checking
    two small traces was 15% of the server's CPU per job with 200 jobs)."""
    from spotwise.market.traces import load_trace

    try:
        st = os.stat(path)
    except OSError:
        return load_trace(path)  # (its own error: the file's name and the fix)
    return _parsed_trace(str(path), st.st_mtime_ns, st.st_size, st.st_ino)


@functools.lru_cache(maxsize=256)
def _parsed_trace(path: str, _mtime_ns: int, _size: int, _inode: int) -> Trace:
    """(a :class:`Trace` is immutable, its counts read-only: every provider may share it)"""
    from spotwise.market.traces import load_trace

    return load_trace(path)


def _load_zones(
    trace: str, zones: list[str] | None, regions: list[str] | None
) -> tuple[tuple[str, ...], np.ndarray, float]:
    from spotwise.market.traces import shipped_trace_path, shipped_traces

    names = [n for n in shipped_traces() if n.startswith(trace + "/")]
    paths = [shipped_trace_path(n) for n in names] if names else []
    if not paths:
        p = Path(trace)
        paths = sorted(p.glob("*.json")) if p.is_dir() else ([p] if p.is_file() else [])
    if not paths:
        groups = sorted({n.split("/")[0] for n in shipped_traces()})
        raise ConfigError(
            f"provider.sim.trace: no trace {trace!r}",
            hint=f"use a shipped group ({', '.join(groups)}) or a directory",
        )
    traces = [_trace(p) for p in paths]
    by_zone = {t.zone: t for t in traces}
    known = sorted({region_of(z) for z in by_zone})
    unknown = sorted(set(regions or ()) - set(known))
    if unknown:
        raise ConfigError(
            f"provider.sim.regions: unknown region(s) {unknown}",
            hint=f"regions in {trace}: {', '.join(known)}",
        )
    chosen = zones or [z for z in sorted(by_zone) if regions is None or region_of(z) in regions]
    stray = [z for z in chosen if regions is not None and region_of(z) not in regions]
    if stray:
        raise ConfigError(
            f"provider.sim.zones: {stray} are in no region of provider.sim.regions",
            hint=f"regions: {', '.join(regions or ())}; or leave zones out to use all of theirs",
        )
    missing = [z for z in chosen if z not in by_zone]
    if missing:
        raise ConfigError(
            f"provider.sim.zones: unknown zone(s) {missing}",
            hint=f"zones in {trace}: {', '.join(sorted(by_zone))}",
        )
    gaps = {by_zone[z].gap_s for z in chosen}
    if len(gaps) != 1:
        raise ConfigError("provider.sim: the chosen traces have different tick lengths")
    n = min(by_zone[z].n_ticks for z in chosen)
    machines = np.stack([by_zone[z].counts[:n] for z in chosen])
    return tuple(chosen), machines, gaps.pop()


class SimProvider(ProcessBacked):
    name = "sim"
    Options = SimOptions

    def __init__(
        self,
        options: dict[str, Any],
        *,
        epoch: float,
        instance_type: str | None,
        preflight: bool = False,
        resources: Resources | None = None,
    ):
        opts = parse_options(SimOptions, self.name, options)
        self.notice_s, self.boot_s, self.notice = opts.notice_s, opts.boot_s, opts.notice
        zones, counts, gap_s = _load_zones(opts.trace, opts.zones, opts.regions)
        self.market = SimMarket(
            zones,
            counts * opts.machines_per_count,
            gap_s,
            opts.time_compression,
            epoch,
            opts.start_hour * 3600.0,
        )
        self.instance_type = instance_type or "p3.2xlarge"
        given = {"spot": opts.spot_usd_per_hour, "on-demand": opts.ondemand_usd_per_hour}

        def price(market: str, zone: str) -> float:
            fixed = given[market]
            return (
                fixed
                if fixed is not None
                else catalog_usd_per_hour(self.instance_type, zone, market)
            )

        self.prices = Prices(
            {
                (m, z): Pricing(price(m, z), price("on-demand", z), opts.time_compression)
                for m in MARKETS
                for z in zones
            },
            capacity=lambda zone, at_s: self.market.is_available(zone, at_s + self.boot_s),
        )
        # The machine sets SPOTWISE_PLATFORM=aws itself when the notice comes from its IMDS.
        self.features = Features(
            zones=zones,
            spot=True,
            notice=NOTICES[opts.notice],
            poll_s=0.05,
            grace_s=self.notice_s,
            platform="none",
            multi_node=True,
        )
        self._machines = ProcessMachines(settle_s=self.features.grace_s)

    def launch(self, req: LaunchRequest) -> Handle:
        """Start the attempt on ``req.nodes`` machines of one zone. On spot, the attempt lasts
        while the zone has that many; then the last node is the one taken away (its ranks
        get the notice, the runtime's agreement makes all ranks save)."""
        now = time.time()
        zone = req.placement.zone or self.market.zones[0]
        notice_at = lost_at = None
        if req.placement.market == "spot":
            if not self.market.is_available(zone, now + self.boot_s, req.nodes):
                machines = f"{req.nodes} machines" if req.nodes > 1 else self.instance_type
                raise CapacityError(
                    f"no spot capacity for {machines} in {zone}",
                    hint="another zone, on-demand or fewer nodes (min_nodes) may have some",
                )
            lost_at = self.market.loss_wall(zone, now + self.boot_s, req.nodes)
            if lost_at is not None:
                notice_at = max(now + self.boot_s, lost_at - self.notice_s)
        banner = f"attempt {req.n} on sim {req.placement.market} {zone}"
        if lost_at is not None:
            banner += f" (spot lasts {lost_at - now:.1f}s wall)"
        quiet: dict[str, Any] = {"boot_s": self.boot_s, "notice_via": self.notice}
        per_node = [
            {**quiet, "banner": f"{banner} node {k}/{req.nodes}" if req.nodes > 1 else banner}
            for k in range(req.nodes)
        ]
        per_node[-1].update(notice_at=notice_at, lost_at=lost_at)
        return self._machines.launch_nodes(req, per_node)
