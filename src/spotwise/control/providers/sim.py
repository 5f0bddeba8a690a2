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

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from spotwise.control.pricing import catalog_usd_per_hour
from spotwise.control.providers.base import (
    Features,
    Handle,
    LaunchRequest,
    Placement,
    Pricing,
)
from spotwise.control.providers.process import ProcessBacked, ProcessMachines
from spotwise.errors import CapacityError, ConfigError

_OPTIONS = {"trace", "zones", "time_compression", "start_hour", "notice_s", "boot_s",
            "spot_usd_per_hour", "ondemand_usd_per_hour", "notice"}
NOTICES = ("sigterm", "aws")


@dataclass(frozen=True)
class SimMarket:
    """Pure replay of availability traces on a compressed clock (no I/O, time passed in)."""

    zones: tuple[str, ...]
    available: np.ndarray  # zones x ticks, bool
    gap_s: float
    compression: float
    epoch: float  # wall time of trace offset ``start_s``
    start_s: float = 0.0

    def tick(self, wall: float) -> int:
        return int((self.start_s + (wall - self.epoch) * self.compression) // self.gap_s)

    def wall_of_tick(self, tick: int) -> float:
        return self.epoch + (tick * self.gap_s - self.start_s) / self.compression

    def is_available(self, zone: str, wall: float) -> bool:
        t = self.tick(wall)
        row = self.available[self.zones.index(zone)]
        return bool(row[t % row.size])

    def loss_wall(self, zone: str, wall: float) -> float | None:
        """When spot in ``zone`` next becomes unavailable (None: not within one trace length)."""
        row = self.available[self.zones.index(zone)]
        t = self.tick(wall)
        ahead = np.roll(row, -(t % row.size))
        gone = np.flatnonzero(~ahead)
        return None if gone.size == 0 else self.wall_of_tick(t + int(gone[0]))


def _load_zones(trace: str, zones: list[str] | None) -> tuple[tuple[str, ...], np.ndarray, float]:
    from spotwise.market.traces import load_trace, shipped_trace_path, shipped_traces

    names = [n for n in shipped_traces() if n.startswith(trace + "/")]
    paths = [shipped_trace_path(n) for n in names] if names else []
    if not paths:
        p = Path(trace)
        paths = sorted(p.glob("*.json")) if p.is_dir() else ([p] if p.is_file() else [])
    if not paths:
        groups = sorted({n.split("/")[0] for n in shipped_traces()})
        raise ConfigError(f"provider.sim.trace: no trace {trace!r}",
                          hint=f"use a shipped group ({', '.join(groups)}) or a directory")
    traces = [load_trace(p) for p in paths]
    by_zone = {t.zone: t for t in traces}
    chosen = zones or sorted(by_zone)
    missing = [z for z in chosen if z not in by_zone]
    if missing:
        raise ConfigError(f"provider.sim.zones: unknown zone(s) {missing}",
                          hint=f"zones in {trace}: {', '.join(sorted(by_zone))}")
    gaps = {by_zone[z].gap_s for z in chosen}
    if len(gaps) != 1:
        raise ConfigError("provider.sim: the chosen traces have different tick lengths")
    n = min(by_zone[z].n_ticks for z in chosen)
    avail = np.stack([by_zone[z].available(1)[:n] for z in chosen])
    return tuple(chosen), avail, gaps.pop()


class SimProvider(ProcessBacked):
    name = "sim"

    def __init__(self, options: dict[str, Any], *, epoch: float, instance_type: str | None):
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ConfigError(f"provider.sim: unknown option(s) {sorted(unknown)}",
                              hint=f"allowed: {', '.join(sorted(_OPTIONS))}")
        try:
            compression = float(options.get("time_compression", 600.0))
            self.notice_s = float(options.get("notice_s", 5.0))
            self.boot_s = float(options.get("boot_s", 0.3))
            start_h = float(options.get("start_hour", 0.0))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"provider.sim: {exc}", hint="numbers expected") from None
        self.notice = str(options.get("notice", "sigterm"))
        if self.notice not in NOTICES:
            raise ConfigError(f"provider.sim.notice: {self.notice!r} is not one of "
                              f"{', '.join(NOTICES)}",
                              hint="sigterm: SIGTERM then SIGKILL after notice_s; aws: the AWS "
                              "IMDS spot/instance-action notice from a loopback emulator")
        if compression <= 0 or self.notice_s < 0 or self.boot_s < 0:
            raise ConfigError("provider.sim: time_compression must be > 0, notice_s and boot_s "
                              ">= 0")
        zones, avail, gap_s = _load_zones(str(options.get("trace", "aws-02-15-2023-first30d")),
                                          options.get("zones"))
        self.market = SimMarket(zones, avail, gap_s, compression, epoch, start_h * 3600.0)
        self.instance_type = instance_type or "p3.2xlarge"
        self._prices: dict[str, float] = {}
        for market in ("spot", "on-demand"):
            key = f"{market.replace('-', '')}_usd_per_hour"
            if key in options:
                self._prices[market] = float(options[key])
        self.features = Features(spot=True, zones=zones, poll_s=0.05, grace_s=self.notice_s)
        self._machines = ProcessMachines()

    def check(self) -> None:
        """The simulated cloud is always reachable."""

    def _price(self, market: str, zone: str) -> float:
        if market in self._prices:
            return self._prices[market]
        return catalog_usd_per_hour(self.instance_type, zone, market)

    def pricing(self, placement: Placement) -> Pricing:
        zone = placement.zone or self.market.zones[0]
        available = placement.market != "spot" or self.market.is_available(
            zone, time.time() + self.boot_s)
        return Pricing(self._price(placement.market, zone), self._price("on-demand", zone),
                       self.market.compression, available)

    def launch(self, req: LaunchRequest) -> Handle:
        now = time.time()
        zone = req.placement.zone or self.market.zones[0]
        notice_at = lost_at = None
        if req.placement.market == "spot":
            if not self.market.is_available(zone, now + self.boot_s):
                raise CapacityError(f"no spot capacity for {self.instance_type} in {zone}",
                                    hint="another zone or on-demand may have some")
            lost_at = self.market.loss_wall(zone, now + self.boot_s)
            if lost_at is not None:
                notice_at = max(now + self.boot_s, lost_at - self.notice_s)
        banner = f"attempt {req.n} on sim {req.placement.market} {zone}"
        if lost_at is not None:
            banner += f" (spot lasts {lost_at - now:.1f}s wall)"
        return self._machines.launch(req, boot_s=self.boot_s, notice_at=notice_at,
                                     lost_at=lost_at, banner=banner, notice_via=self.notice)
