"""Interruption notices: detectors per platform, merged by a watcher into one deadline.

Adding a platform is one new module plus one line in :data:`CLOUDS` (metadata-service clouds)
or :data:`DETECTORS`.
"""

from __future__ import annotations

from spotwise.notices.base import Detector, Notice, NoticeKind, NoticeSource
from spotwise.registry import Registry

# Every detector class by name (for plugins and introspection).
DETECTORS: Registry[Detector] = Registry(
    "detector",
    {
        "signal": "spotwise.notices.signals:SignalDetector",
        "kubernetes": "spotwise.notices.kubernetes:KubernetesDetector",
        "slurm": "spotwise.notices.slurm:SlurmDetector",
        "aws": "spotwise.notices.aws:AwsDetector",
        "gcp": "spotwise.notices.gcp:GcpDetector",
        "azure": "spotwise.notices.azure:AzureDetector",
        "heartbeat": "spotwise.notices.heartbeat:HeartbeatDetector",
    },
    group="spotwise.detectors",
)

# Clouds with a metadata service: endpoint override, probe and detector factory.
CLOUDS: Registry[object] = Registry(
    "cloud platform",
    {
        "aws": "spotwise.notices.aws:PLATFORM",
        "gcp": "spotwise.notices.gcp:PLATFORM",
        "azure": "spotwise.notices.azure:PLATFORM",
    },
    group="spotwise.clouds",
)

__all__ = ["CLOUDS", "DETECTORS", "Detector", "Notice", "NoticeKind", "NoticeSource"]
