"""Rightsizing advice from GPU samples and the shipped catalog."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from spotwise.control.store import JobState, Store
from spotwise.market.catalog import load_catalog
from spotwise.telemetry.events import EventLog
from spotwise.telemetry.rightsizing import rightsize

from .conftest import add_attempt, cli

GB = 1_000_000_000
TYPES = load_catalog().find(cloud="aws")
PRICE = {t.instance_type: t for t in TYPES}


def samples(util: float, used_gb: float, total_gb: float = 16.0, gpus: int = 1, n: int = 5):
    device = {
        "util_pct": util,
        "mem_used_bytes": int(used_gb * GB),
        "mem_total_bytes": int(total_gb * GB),
    }
    return [
        {"kind": "gpu", "devices": [{"index": i, **device} for i in range(gpus)]} for _ in range(n)
    ]


def test_an_idle_v100_is_moved_to_a_cheaper_gpu_with_room_for_its_memory() -> None:
    advice = rightsize(
        samples(20, 3.0),
        instance_type="p3.2xlarge",
        market="on-demand",
        remaining_h=10.0,
        types=TYPES,
    )
    assert advice.verdict == "smaller"
    assert advice.mean_util == pytest.approx(0.2) and advice.peak_mem_gb == pytest.approx(3.0)
    best = advice.suggestions[0]
    cheapest = min(
        (
            t
            for t in TYPES
            if t.gpus == 1 and t.gpu_mem_gb >= 3.6 and t.cheapest_on_demand_usd_per_hour is not None
        ),
        key=lambda t: t.cheapest_on_demand_usd_per_hour,
    )
    assert best.instance_type == cheapest.instance_type
    stay = 10.0 * PRICE["p3.2xlarge"].cheapest_on_demand_usd_per_hour
    assert best.difference_usd == pytest.approx(10.0 * best.usd_per_hour - stay)
    assert best.difference_usd < 0 and "saves $" in advice.line()


def test_a_saturated_gpu_gets_more_of_them_at_fewer_hours() -> None:
    advice = rightsize(
        samples(98, 10.0), instance_type="p3.2xlarge", market="spot", remaining_h=8.0, types=TYPES
    )
    assert advice.verdict == "larger"
    [best] = advice.suggestions
    assert (best.instance_type, best.gpus, best.hours) == ("p3.8xlarge", 4, pytest.approx(2.0))
    spot = PRICE["p3.8xlarge"].cheapest_spot_usd_per_hour
    assert best.difference_usd == pytest.approx(
        2.0 * spot - 8.0 * PRICE["p3.2xlarge"].cheapest_spot_usd_per_hour
    )


def test_well_used_keeps_the_instance_and_no_samples_says_why() -> None:
    keep = rightsize(
        samples(75, 11.0), instance_type="p3.2xlarge", market="spot", remaining_h=1.0, types=TYPES
    )
    assert keep.verdict == "keep" and keep.suggestions == []
    none = rightsize([], instance_type="p3.2xlarge", market="spot", remaining_h=1.0, types=TYPES)
    assert none.verdict == "unknown" and "no GPU samples" in none.line()


def test_advise_from_job_reads_the_jobs_gpu_samples(tmp_path: Path) -> None:
    store = Store()
    spec = {
        "name": "g",
        "command": ["python", "t.py"],
        "provider": {"name": "local"},
        "expected_runtime_s": 7200.0,
        "resources": {"instance_type": "g5.12xlarge"},
    }
    job = store.create_job("g", spec, None)
    add_attempt(
        store,
        job.id,
        start=time.time(),
        market="on-demand",
        zone="",
        usd=5.672,
        ondemand=5.672,
        scale=1.0,
    )
    store.update_job(job.id, state=JobState.RUNNING)
    events = EventLog(job.dir / "checkpoint" / "events.jsonl")  # where Run writes them
    for e in samples(15, 5.0, total_gb=24.0, gpus=4):
        events.emit("gpu", devices=e["devices"])
    out = cli("advise", "--from-job", job.id, "--json", home=store.home)
    assert out.returncode == 0, out.stderr
    advice = json.loads(out.stdout)
    assert advice["verdict"] == "smaller" and advice["instance_type"] == "g5.12xlarge"
    # 15% of 4 GPUs fits on one at most 80% busy: single-GPU types, 2 h of work left
    assert all(s["gpus"] == 1 for s in advice["suggestions"])
    assert advice["remaining_h"] == pytest.approx(2.0, abs=0.01)
    text = cli("advise", "--from-job", job.id, home=store.home)
    assert "under-used (GPU 15% busy" in text.stdout
