"""The sim provider with the controller, on a tiny hand-made trace (1 tick = 1 wall second)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

N = 2000


def _trace(d: Path, zone: str, counts: list[int]) -> None:
    (d / f"{zone}_v100_1.json").write_text(
        json.dumps({"metadata": {"gap_seconds": 10}, "data": counts + [1] * (N - len(counts))})
    )


def test_notice_preemption_zone_hop_and_simulated_billing(workdir: Path, kit):
    traces = workdir / "traces"
    traces.mkdir()
    _trace(traces, "za", [0] * N)  # never any capacity
    _trace(traces, "zb", [1, 1, 1] + [0] * (N - 3))  # gone for good at tick 3 (3 s wall)
    _trace(traces, "zc", [1])  # always there

    spec = kit.spec(
        workdir,
        command="python standin.py 0 5",
        market="spot",
        provider={
            "name": "sim",
            "trace": str(traces),
            "zones": ["za", "zb", "zc"],
            "time_compression": 10,
            "notice_s": 1.5,
            "boot_s": 0,
            "spot_usd_per_hour": 1.0,
            "ondemand_usd_per_hour": 3.0,
        },
    )
    summary = kit.run(spec)
    assert summary["state"] == "SUCCEEDED"
    attempts = summary["attempts"]
    assert [(a["zone"], a["reason"]) for a in attempts] == [
        ("zb", "preempted"),
        ("zc", "succeeded"),
    ]
    first = attempts[0]
    assert first["exit_code"] == 75  # the notice came early enough to save
    log = Path(summary["log"]).read_text()
    assert "interruption notice: SIGTERM" in log and "saved on notice" in log
    # billed in simulated hours: wall seconds x 10 at $1/h spot, vs $3/h on-demand
    for a in attempts:
        assert a["cost_usd"] == pytest.approx((a["end"] - a["start"]) * 10 / 3600, abs=1e-6)
    assert summary["ondemand_cost_usd"] == pytest.approx(3 * summary["cost_usd"], abs=1e-5)
    from spotwise.control.store import Store

    refused = [e for e in Store().events(summary["id"]) if e["kind"] == "launch-refused"]
    assert refused and "za" in refused[0]["message"]


def test_machine_taken_away_when_the_notice_is_ignored(workdir: Path, kit):
    (workdir / "stubborn.py").write_text(
        "import signal, sys, time, os\n"
        "runs = int(open('runs').read()) if os.path.exists('runs') else 0\n"
        "open('runs', 'w').write(str(runs + 1))\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "time.sleep(4 if runs == 0 else 0.2)\n"
    )
    traces = workdir / "traces"
    traces.mkdir()
    _trace(traces, "zb", [1, 1] + [0] * 10)
    _trace(traces, "zc", [1])
    spec = kit.spec(
        workdir,
        command="python stubborn.py",
        market="spot",
        provider={
            "name": "sim",
            "trace": str(traces),
            "zones": ["zb", "zc"],
            "time_compression": 10,
            "notice_s": 0.5,
            "boot_s": 0,
            "spot_usd_per_hour": 1.0,
            "ondemand_usd_per_hour": 3.0,
        },
    )
    summary = kit.run(spec)
    assert summary["state"] == "SUCCEEDED"
    assert [(a["zone"], a["reason"]) for a in summary["attempts"]] == [
        ("zb", "lost"),
        ("zc", "succeeded"),
    ]
    assert "machine taken away: SIGKILL" in Path(summary["log"]).read_text()


ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.e2e
def test_aws_style_notice_through_the_imds_emulator(workdir: Path, kit):
    """The runtime in the real digits example sees the notice on (emulated) IMDS, saves, and
    exits 75 before the machine is taken away; the job resumes and finishes."""
    traces = workdir / "traces"
    traces.mkdir()
    _trace(traces, "zb", [1] * 60 + [0] * (N - 60))  # 60 s of spot (wall), then gone
    _trace(traces, "zc", [1])
    train = ROOT / "examples" / "digits" / "train.py"
    # The first attempt cannot finish before the machine is taken: its 300 steps sleep 0.2 s
    # each (60 s); the resumed attempt runs at 0.02 s a step. The notice is AWS's two minutes,
    # more than the 60 s of spot, so it is up on IMDS from the start: the runtime has the whole
    # minute to start, see it, save and exit (on a loaded machine 30 s, and before that a
    # one-second notice, were less than that took, and the machine was taken first).
    step_sleep = '"$(if [ "$SPOTWISE_ATTEMPT" = 1 ]; then echo 0.2; else echo 0.02; fi)"'
    spec = kit.spec(
        workdir,
        market="spot",
        command=[
            "sh",
            "-c",
            f'exec "{sys.executable}" "{train}" --run-dir "$SPOTWISE_CHECKPOINT_DIR" '
            f"--steps 300 --save-every 50 --step-sleep {step_sleep}",
        ],
        provider={
            "name": "sim",
            "trace": str(traces),
            "zones": ["zb", "zc"],
            "time_compression": 10,
            "notice_s": 120,
            "boot_s": 0,
            "notice": "aws",
            "spot_usd_per_hour": 1.0,
            "ondemand_usd_per_hour": 3.0,
        },
    )
    summary = kit.run(spec)
    assert summary["state"] == "SUCCEEDED"
    assert [(a["zone"], a["reason"], a["exit_code"]) for a in summary["attempts"]] == [
        ("zb", "preempted", 75),
        ("zc", "succeeded", 0),
    ]
    log = Path(summary["log"]).read_text()
    assert "interruption notice: AWS spot/instance-action" in log
    assert "resumed from step" in log and "final-weights-sha256" in log
