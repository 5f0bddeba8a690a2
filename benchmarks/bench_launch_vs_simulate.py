"""One trace, one policy, one start, one set of terms: ``spotwise launch`` on the sim provider
with real training (time-compressed) and ``spotwise simulate`` make the same placements and the
same switches, at a cost that agrees within the compression jitter (docs/control.md).

A benchmark rather than a test: with real training at 60x, whether the measured step rate puts
the job behind Uniform Progress's line during the outage depends on the machine's speed at that
moment, and in the full suite on a 2-core machine it flipped often enough to make CI flaky. The
same agreement is tested deterministically (real Controller, injected clock, sim double) by
tests/control/test_live_properties.py and test_live_policy.py.

    SPOTWISE_PLATFORM=none python benchmarks/bench_launch_vs_simulate.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from spotwise.control.controller import Controller
from spotwise.control.spec import parse_spec
from spotwise.control.store import JobState, Store
from spotwise.control.submission import submit
from spotwise.control.summary import job_summary

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "digits" / "train.py"
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]
GAP_S, COMPRESSION = 60, 60  # one trace tick per wall second
# spot for 10 ticks, gone for 15 (the job falls behind and buys on-demand), then back for good:
# Uniform Progress goes spot -> on-demand -> spot
TRACE = [1] * 10 + [0] * 15 + [1] * 400
COST_TOLERANCE = 0.5  # relative; see docs/control.md "Launch and simulate agree"


def _segments(timeline: list[int]) -> list[str]:
    names = {1: "on-demand", 2: "spot"}
    out, prev = [], 0
    for m in timeline:
        if m != prev and m:
            out.append(names[m])
        prev = m
    return out


def launch_and_simulate_agree_on_one_trace(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    trace = traces / "za_v100_1.json"
    trace.write_text(json.dumps({"metadata": {"gap_seconds": GAP_S}, "data": TRACE}))
    spec = parse_spec(
        {
            "name": "agree",
            "market": "auto",
            "policy": "uniform-progress",
            "command": [
                "python",
                str(TRAIN),
                "--run-dir",
                "$SPOTWISE_CHECKPOINT_DIR",
                "--steps",
                "400",
                "--save-every",
                "10",
                "--step-sleep",
                "0.04",
            ],
            # no expected_runtime: the policy starts from the measured step rate (C = steps / rate),
            # so both sides plan the job this machine actually runs
            "steps": 400,
            "deadline": "60s",
            "changeover": "4s",
            "decision_interval": f"{GAP_S / COMPRESSION}s",
            "zone_cooldown": 0,
            "provider": {
                "name": "sim",
                "trace": str(traces),
                "time_compression": COMPRESSION,
                "notice_s": 1,
                "boot_s": 0.05,
                "spot_usd_per_hour": 1.0,
                "ondemand_usd_per_hour": 3.0,
            },
        },
        base_dir=tmp_path,
    )
    store = Store()
    job = submit(store, spec)
    assert Controller(store, job.id).run() is JobState.SUCCEEDED
    job = store.job(job.id)
    live = job_summary(store, job)
    assert job.policy is not None
    problem = job.policy["problem"]

    out = subprocess.run(
        [
            *SPOTWISE,
            "simulate",
            "--trace",
            str(trace),
            "--policy",
            "uniform-progress",
            "--compute-h",
            str(problem["compute_h"]),
            "--deadline-h",
            str(problem["deadline_h"]),
            "--changeover-h",
            str(problem["changeover_h"]),
            "--spot-price",
            "1.0",
            "--ondemand-price",
            "3.0",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    simulated = json.loads(out.stdout)["runs"][0]
    assert simulated["deadline_met"]

    from spotwise.market.policies import Problem, make_policy
    from spotwise.market.simulate import Markets, simulate_run
    from spotwise.market.traces import load_trace

    replay = simulate_run(
        make_policy("uniform-progress"),
        Problem(**problem),
        Markets.from_traces([load_trace(trace)]),
        0,
        record=True,
    )
    assert replay.cost_usd == pytest.approx(simulated["cost_usd"])
    assert replay.timeline is not None  # record=True
    placements = [a["market"] for a in live["attempts"]]
    assert placements == _segments(replay.timeline.market) == ["spot", "on-demand", "spot"]
    # the first attempt saved on the notice (preempted), or, on a slow machine, was still
    # starting when spot went away (lost): a preemption either way
    assert [a["reason"] for a in live["attempts"]][1:] == ["switched", "succeeded"]
    assert live["preemptions"] == 1 and live["switches"] == 1
    assert simulated["changeovers"] == len(placements)
    finish_s = live["attempts"][-1]["end"] - job.created_at
    assert finish_s <= spec.deadline_s
    ratio = live["cost_usd"] / simulated["cost_usd"]
    print(
        f"launch-vs-simulate: {ratio:.3f} (live ${live['cost_usd']:.4f}, "
        f"simulated ${simulated['cost_usd']:.4f})"
    )
    timings = [
        (
            a["market"],
            round(a["start"] - job.created_at, 2),
            round((a["running_at"] or a["start"]) - job.created_at, 2),
            round(a["end"] - job.created_at, 2),
        )
        for a in live["attempts"]
    ]
    assert abs(ratio - 1) <= COST_TOLERANCE, (timings, replay.timeline.market, problem)


if __name__ == "__main__":
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        os.environ.setdefault("SPOTWISE_PLATFORM", "none")
        os.environ["SPOTWISE_HOME"] = str(Path(tmp) / "home")
        launch_and_simulate_agree_on_one_trace(Path(tmp))
