"""/metrics of a training process and of the controller's store, parsed with prometheus_client's
own text parser."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spotwise.control.store import JobState, Store
from spotwise.control.summary import job_summary
from spotwise.errors import ConfigError
from spotwise.telemetry.events import read_events
from spotwise.telemetry.jobview import job_view
from spotwise.telemetry.metrics import render

from .conftest import add_attempt
from .tools import TRAIN


def _samples(text: str) -> dict[str, list]:
    out: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append(s)
    return out


def _wait_for(path: Path, kind: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = read_events(path, kind)
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError(f"no {kind} event in {path}")


def test_training_process_metrics_and_gpu_samples(tmp_path: Path, fake_nvml_dir: Path) -> None:
    env = {
        **os.environ,
        "SPOTWISE_METRICS_PORT": "0",
        "SPOTWISE_GPU_SAMPLE_S": "0.05",
        "LD_LIBRARY_PATH": str(fake_nvml_dir),
    }
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", TRAIN, str(run_dir), "200", "0.01"], env=env)
    try:
        events = run_dir / "events.jsonl"
        port = _wait_for(events, "metrics-endpoint")["port"]
        _wait_for(events, "checkpoint")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            got = _samples(r.read().decode())
    finally:
        assert proc.wait(timeout=120) == 0
    [steps] = got["spotwise_run_steps_total"]
    assert 20 <= steps.value <= 200
    assert got["spotwise_run_checkpoints_total"][0].value >= 1
    assert got["spotwise_run_step_seconds"][0].value >= 0.01
    assert got["spotwise_run_save_stall_seconds"][0].value > 0
    assert got["spotwise_run_checkpoint_age_seconds"][0].value >= 0
    assert got["spotwise_run_notices_total"][0].value == 0
    [loss] = got["spotwise_run_metric"]
    assert loss.labels == {"name": "loss"} and loss.value >= 0
    util = {s.labels["gpu"]: s.value for s in got["spotwise_gpu_utilization_ratio"]}
    assert util == {"0": pytest.approx(0.87), "1": pytest.approx(0.12)}
    power = {s.labels["gpu"]: s.value for s in got["spotwise_gpu_power_watts"]}
    assert power == {"0": pytest.approx(312.5)}  # device 1 cannot report power
    assert got["spotwise_gpu_memory_total_bytes"][0].labels["model"] == "Fake H100 80GB"
    # the same samples and the logged loss are in the run's event log, for the dashboard
    gpu = read_events(run_dir / "events.jsonl", "gpu")
    assert len(gpu) >= 1 and gpu[0]["devices"][0]["util_pct"] == 87.0
    logged = read_events(run_dir / "events.jsonl", "metrics")
    [start] = read_events(run_dir / "events.jsonl", "start")
    [end] = read_events(run_dir / "events.jsonl", "finished")
    assert set(logged[-1]["values"]) == {"loss"}
    assert 1 <= len(logged) <= end["time"] - start["time"] + 1  # one a second at most


def test_bad_metrics_port_names_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    from spotwise import Run

    model = torch.nn.Linear(2, 1)
    monkeypatch.setenv("SPOTWISE_METRICS_PORT", "http")
    with pytest.raises(ConfigError, match="SPOTWISE_METRICS_PORT='http'"):
        Run(tmp_path / "r", state={"model": model}, notices=None)
    monkeypatch.delenv("SPOTWISE_METRICS_PORT")
    with pytest.raises(ConfigError, match="metrics_port=70000"):
        Run(tmp_path / "r", state={"model": model}, notices=None, metrics_port=70000)
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    threads = threading.active_count()
    with pytest.raises(ConfigError, match=r"cannot serve training metrics on 127\.0\.0\.1:"):
        Run(
            tmp_path / "r",
            state={"model": model},
            notices=None,
            metrics_port=taken.getsockname()[1],
        )
    taken.close()
    assert threading.active_count() == threads  # nothing left running
    Run(tmp_path / "r", state={"model": model}, notices=None).close()  # the directory was released


def _job(store: Store, *, created: float, deadline_s: float | None = 600.0) -> str:
    spec = {
        "name": "m",
        "command": ["python", "x.py"],
        "provider": {"name": "local"},
        "deadline_s": deadline_s,
        "expected_runtime_s": 100.0,
    }
    return store.create_job("m", spec, None, now=created).id


def test_controller_metrics_equal_status_and_the_ledger() -> None:
    store = Store()
    now = time.time()
    done = _job(store, created=now - 300)
    add_attempt(
        store,
        done,
        start=now - 290,
        running=now - 288,
        end=now - 200,
        reason="preempted",
        exit_code=75,
    )
    add_attempt(
        store,
        done,
        start=now - 190,
        running=now - 189,
        end=now - 100,
        zone="b",
        usd=1.5,
        reason="succeeded",
        exit_code=0,
    )
    store.update_job(done, state=JobState.SUCCEEDED, now=now - 99)
    running = _job(store, created=now - 50)
    add_attempt(store, running, start=now - 40, market="on-demand", usd=3.0)
    store.update_job(running, state=JobState.RUNNING)
    _job(store, created=now - 10)

    got = _samples(render(store).decode())
    states = {s.labels["state"]: s.value for s in got["spotwise_jobs"]}
    assert states["SUCCEEDED"] == 1 and states["RUNNING"] == 1 and states["PENDING"] == 1
    assert sum(states.values()) == 3

    def by_job(name: str) -> dict[str, float]:
        return {s.labels["job"]: s.value for s in got[name]}

    summary = job_summary(store, store.job(done))
    assert by_job("spotwise_job_attempts_total")[done] == 2
    assert by_job("spotwise_job_preemptions_total")[done] == 1
    assert by_job("spotwise_job_cost_usd_total")[done] == pytest.approx(summary["cost_usd"])
    assert by_job("spotwise_job_ondemand_cost_usd_total")[done] == pytest.approx(
        summary["ondemand_cost_usd"]
    )
    view = job_view(store, store.job(done))
    assert by_job("spotwise_job_savings_usd")[done] == pytest.approx(view.ledger.savings_usd)
    kinds = {
        s.labels["kind"]: s.value
        for s in got["spotwise_job_goodput_seconds_total"]
        if s.labels["job"] == done
    }
    assert sum(kinds.values()) == pytest.approx(201, abs=1e-3)  # created .. last state change
    # finished jobs have no slack; the running one has 600 - 50 s left, all 100 s still to do
    slack = by_job("spotwise_job_deadline_slack_seconds")
    assert done not in slack and slack[running] == pytest.approx(600 - 50 - 100, abs=5)


def test_logged_names_never_clash_with_the_event_fields(tmp_path: Path) -> None:
    import torch

    from spotwise import Run

    model = torch.nn.Linear(2, 1)
    run = Run(tmp_path / "r", state={"model": model}, steps=2, notices=None, gpu_sample_s=0)
    for _ in run:
        run.log(kind=1.0, step=2.0, time=3.0)
    [logged] = read_events(tmp_path / "r" / "events.jsonl", "metrics")
    assert logged["kind"] == "metrics" and logged["values"] == {
        "kind": 1.0,
        "step": 2.0,
        "time": 3.0,
    }
