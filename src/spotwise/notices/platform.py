"""Which detectors to run here: ``SPOTWISE_PLATFORM``, endpoint overrides, or auto-detection.

Rules (docs/notices.md):
- signals are always watched; on SLURM and Kubernetes with that platform's deadline rules;
- ``SPOTWISE_PLATFORM=aws|gcp|azure`` runs that cloud's detectors with no probe at all;
- ``SPOTWISE_PLATFORM=none`` (or slurm/kubernetes) probes no cloud metadata service;
- an endpoint override (``AWS_EC2_METADATA_SERVICE_ENDPOINT``, ``GCE_METADATA_HOST``,
  ``SPOTWISE_AZURE_METADATA_ENDPOINT``) always runs that cloud's detectors against it, unprobed:
  that is how the loopback emulators are used;
- unset (or ``auto``): the clouds are probed in parallel on a background thread, each probe
  short and proxy-free, all within :data:`PROBE_BUDGET_S`; a cloud that does not answer stays off;
- on every platform, the unsupervised-machine watchdog (:mod:`spotwise.notices.heartbeat`)
  when the controller set ``SPOTWISE_HEARTBEAT_URI`` and ``SPOTWISE_UNSUPERVISED_LIMIT_S``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import cast

from spotwise import settings
from spotwise.errors import NoticeError
from spotwise.notices.base import CloudPlatform, Detector
from spotwise.notices.heartbeat import heartbeat_detectors
from spotwise.notices.signals import SignalDetector

log = logging.getLogger("spotwise.notices")

# the platforms whose notices are not a metadata service's: scheduler and cluster signals
SIGNAL_PLATFORMS = ("slurm", "kubernetes")
PROBE_BUDGET_S = 2.0  # total wall time auto-detection may spend (in the background)
PROBE_TIMEOUT_S = 0.5  # per-request connect/read timeout of a probe


@dataclass
class Plan:
    platform: str
    signals: SignalDetector
    remote: list[Detector] = field(default_factory=list)
    discover: Callable[[], list[Detector]] | None = None


def platforms() -> tuple[str, ...]:
    """Every value ``SPOTWISE_PLATFORM`` takes: the registered clouds and signal platforms."""
    from spotwise.notices import CLOUDS

    return ("auto", *CLOUDS.names(), *SIGNAL_PLATFORMS, "none")


def platform_from_env(env: Mapping[str, str]) -> str:
    raw = settings.PLATFORM.raw(env).lower() or "auto"
    known = platforms()
    if raw not in known:
        raise NoticeError(
            f"{settings.PLATFORM.name}={raw!r} is not a platform spotwise knows",
            hint=f"use one of {', '.join(known)}",
        )
    return raw


def cloud(name: str) -> CloudPlatform:
    from spotwise.notices import CLOUDS

    return cast(CloudPlatform, CLOUDS.load(name))


def signal_detector(platform: str, env: Mapping[str, str]) -> SignalDetector:
    """The signal detector with this platform's deadline rules (from :data:`DETECTORS`)."""
    from spotwise.notices import DETECTORS

    if platform == "auto":  # what the scheduler or the cluster says about this process
        platform = (
            "slurm"
            if env.get("SLURM_JOB_ID")
            else "kubernetes"
            if env.get("KUBERNETES_SERVICE_HOST")
            else "signal"
        )
    name = platform if platform in SIGNAL_PLATFORMS else "signal"
    return cast(SignalDetector, DETECTORS.load(name)(env=env))


def plan_from_environment(env: Mapping[str, str] | None = None) -> Plan:
    env = os.environ if env is None else env
    from spotwise.notices import CLOUDS

    platform = platform_from_env(env)
    plan = Plan(platform=platform, signals=signal_detector(platform, env))
    plan.remote.extend(heartbeat_detectors(env))
    to_probe: list[CloudPlatform] = []
    for name in CLOUDS.names():
        spec = cloud(name)
        override = env.get(spec.override_var, "").strip()
        if override:
            plan.remote.extend(spec.detectors(spec.base_from_override(override), env))
        elif platform == name:
            plan.remote.extend(spec.detectors(spec.default_base, env))
        elif platform == "auto" and not _disabled(spec, env):
            to_probe.append(spec)
    if to_probe:
        plan.discover = lambda: discover(to_probe, env)
    return plan


def _disabled(spec: CloudPlatform, env: Mapping[str, str]) -> bool:
    return spec.name == "aws" and env.get("AWS_EC2_METADATA_DISABLED", "").lower() == "true"


def discover(
    clouds: list[CloudPlatform],
    env: Mapping[str, str],
    *,
    budget_s: float = PROBE_BUDGET_S,
    timeout_s: float = PROBE_TIMEOUT_S,
) -> list[Detector]:
    """Probe each cloud's default endpoint in parallel; detectors for those that answer.

    Returns within ``budget_s`` even if a probe hangs (the probe threads are daemons).
    """
    answered: dict[str, bool] = {}

    def probe(spec: CloudPlatform) -> None:
        try:
            answered[spec.name] = spec.probe(spec.default_base, timeout_s)
        except Exception as exc:  # a probe bug must not stop start-up: that cloud is off
            log.exception("spotwise: probing %s failed (%r); treating it as absent", spec.name, exc)
            answered[spec.name] = False

    threads = [
        threading.Thread(
            target=probe, args=(spec,), daemon=True, name=f"spotwise-probe-{spec.name}"
        )
        for spec in clouds
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=max(0.0, budget_s - (time.monotonic() - started)))
    found: list[Detector] = []
    for spec in clouds:
        if answered.get(spec.name):
            log.info("spotwise: %s metadata service found; watching its notices", spec.name)
            found.extend(spec.detectors(spec.default_base, env))
    return found
