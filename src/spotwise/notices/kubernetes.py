"""Kubernetes: a SIGTERM to PID 1, then SIGKILL after ``terminationGracePeriodSeconds``.

The downward API does not expose the grace period, so pass it in: ``SPOTWISE_GRACE_S`` (e.g.
from the same value in the pod spec); the fallback is Kubernetes' default of 30 s.
"""

from __future__ import annotations

from collections.abc import Mapping

from spotwise.notices.signals import SignalDetector


class KubernetesDetector(SignalDetector):
    name = "kubernetes"

    def __init__(self, *, env: Mapping[str, str] | None = None) -> None:
        super().__init__(env=env)
