"""Which detectors run: SPOTWISE_PLATFORM, endpoint overrides, auto-detection probes."""

from __future__ import annotations

import time

import pytest

from spotwise.emulators import AwsImdsEmulator, AzureScheduledEventsEmulator, GcpMetadataEmulator
from spotwise.errors import NoticeError
from spotwise.notices.platform import cloud, discover, plan_from_environment


def names(plan) -> list[str]:  # type: ignore[no-untyped-def]
    return [d.name for d in plan.remote]


def close(plan) -> None:  # type: ignore[no-untyped-def]
    plan.signals.close()


def test_none_means_signals_only_and_no_probe() -> None:
    plan = plan_from_environment({"SPOTWISE_PLATFORM": "none"})
    close(plan)
    assert plan.signals.name == "signal"
    assert plan.remote == [] and plan.discover is None


def test_unknown_platform_is_a_clear_error() -> None:
    with pytest.raises(NoticeError, match="SPOTWISE_PLATFORM='aws2'") as err:
        plan_from_environment({"SPOTWISE_PLATFORM": "aws2"})
    assert all(name in str(err.value) for name in ("aws", "gcp", "azure", "slurm", "none"))


def test_explicit_cloud_uses_its_detectors_without_probing() -> None:
    plan = plan_from_environment({"SPOTWISE_PLATFORM": "gcp"})
    close(plan)
    assert names(plan) == ["gcp", "gcp"]  # preempted + maintenance-event
    assert plan.discover is None


def test_overrides_enable_their_detector_even_with_platform_none() -> None:
    env = {
        "SPOTWISE_PLATFORM": "none",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": "http://127.0.0.1:1338/",
        "GCE_METADATA_HOST": "127.0.0.1:1339",
        "SPOTWISE_AZURE_METADATA_ENDPOINT": "http://127.0.0.1:1340",
    }
    plan = plan_from_environment(env)
    close(plan)
    assert sorted(names(plan)) == ["aws", "azure", "gcp", "gcp"]
    bases = {d.name: d.base for d in plan.remote}
    assert bases == {
        "aws": "http://127.0.0.1:1338",
        "gcp": "http://127.0.0.1:1339",
        "azure": "http://127.0.0.1:1340",
    }


def test_slurm_and_kubernetes_pick_their_signal_rules() -> None:
    plan = plan_from_environment({"SPOTWISE_PLATFORM": "kubernetes", "SPOTWISE_GRACE_S": "45"})
    close(plan)
    assert plan.signals.name == "kubernetes" and plan.signals.grace_s == 45.0
    plan = plan_from_environment({"SPOTWISE_PLATFORM": "slurm"})
    close(plan)
    assert plan.signals.name == "slurm" and plan.discover is None and plan.remote == []


def test_auto_detection_is_deferred_to_the_background() -> None:
    # Constructing the plan probes nothing; discovery is a callable the watcher runs later.
    started = time.monotonic()
    plan = plan_from_environment({"SPOTWISE_PLATFORM": "auto", "SLURM_JOB_ID": "7"})
    close(plan)
    assert time.monotonic() - started < 0.5
    assert plan.signals.name == "slurm"
    assert plan.discover is not None


def test_discover_finds_each_cloud_by_its_own_protocol_only() -> None:
    specs = [cloud("aws"), cloud("gcp"), cloud("azure")]
    with GcpMetadataEmulator(port=0) as gcp:
        # Point every cloud's default endpoint at the GCP emulator: only GCP may say yes.
        pointed = [type(s)(**{**s.__dict__, "default_base": gcp.url}) for s in specs]
        found = discover(pointed, {})
    assert [d.name for d in found] == ["gcp", "gcp"]
    for emu_cls, expected in ((AwsImdsEmulator, "aws"), (AzureScheduledEventsEmulator, "azure")):
        with emu_cls(port=0) as emu:
            pointed = [type(s)(**{**s.__dict__, "default_base": emu.url}) for s in specs]
            assert {d.name for d in discover(pointed, {})} == {expected}


def test_discover_stays_within_budget_when_endpoints_hang(closed_port_url: str) -> None:
    specs = [cloud("aws"), cloud("gcp"), cloud("azure")]
    with AwsImdsEmulator(port=0, hang_s=10) as emu:
        emu.inject("hang")
        pointed = [type(s)(**{**s.__dict__, "default_base": emu.url}) for s in specs]
        started = time.monotonic()
        found = discover(pointed, {}, budget_s=1.0, timeout_s=0.4)
        assert time.monotonic() - started < 1.5
    assert found == []
    refused = [type(s)(**{**s.__dict__, "default_base": closed_port_url}) for s in specs]
    started = time.monotonic()
    assert discover(refused, {}) == []
    assert time.monotonic() - started < 0.5  # off-cloud: refused at once, costs ~nothing
