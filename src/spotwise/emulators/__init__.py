"""Loopback servers speaking the AWS, GCP and Azure metadata protocols, to rehearse a
preemption on a laptop and to test the detectors over real HTTP. They share no code with the
detectors (an emulator that reused the client's parsing would prove nothing)."""

from __future__ import annotations

from spotwise.emulators.aws import AwsImdsEmulator
from spotwise.emulators.azure import AzureScheduledEventsEmulator
from spotwise.emulators.gcp import GcpMetadataEmulator

EMULATORS = {
    "aws": AwsImdsEmulator,
    "gcp": GcpMetadataEmulator,
    "azure": AzureScheduledEventsEmulator,
}

__all__ = ["EMULATORS", "AwsImdsEmulator", "AzureScheduledEventsEmulator", "GcpMetadataEmulator"]
