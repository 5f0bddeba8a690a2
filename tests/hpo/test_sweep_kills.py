"""`spotwise sweep` with 2 workers on the sim market: the workers' first zone loses its spot
capacity (notice, exit 75, relaunch elsewhere) and one worker is SIGKILLed mid-trial at random
(relaunched after the error). The study ends with 8 COMPLETE trials numbered 0-7, no FAIL, the
same values as an uninterrupted sweep (equal study-sha256), and a preempted trial shows two or
more attempts and the step it resumed at."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits" / "sweep.py"
# trials of about 3 s: long enough for the killer to find one training on a loaded machine
ARGS = ["--steps", "30", "--step-sleep", "0.1", "--lease-ttl", "2"]
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def _reference(tmp: Path) -> str:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--trials", "8", "--storage", f"sqlite:///{tmp}/ref.db",
         "--run-root", str(tmp / "ref"), *ARGS, "--step-sleep", "0"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "SPOTWISE_PLATFORM": "none"})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.strip().splitlines()[-1]


def _kill_one_mid_trial(
    db: Path, run_root: Path, rng: random.Random, sweep: subprocess.Popen[str]
) -> int:
    """SIGKILL a worker while it trains a trial that already has a checkpoint."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        assert sweep.poll() is None, "the sweep ended before a trial was caught training"
        try:
            trials = optuna.load_study(study_name="digits", storage=f"sqlite:///{db}").get_trials()
        except Exception:  # the study does not exist yet
            trials = []
        for t in trials:
            attempts = t.user_attrs.get("spotwise.attempts", [])
            if t.state.name == "RUNNING" and attempts and \
                    any((run_root / f"trial-{t.number:05d}").glob("step-*")):  # fmt: skip
                time.sleep(rng.uniform(0.0, 0.3))
                # the trial may have finished meanwhile: kill only a worker still training it
                study = optuna.load_study(study_name="digits", storage=f"sqlite:///{db}")
                if study.get_trials()[t.number].state.name != "RUNNING":
                    continue
                try:
                    os.kill(attempts[-1]["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    continue
                return t.number
        time.sleep(0.1)
    raise AssertionError("no trial was running with a checkpoint within 180 s")


def test_sweep_survives_notices_and_sigkill_with_the_uninterrupted_result(tmp_path):
    reference = _reference(tmp_path)
    traces = tmp_path / "traces"
    traces.mkdir()
    for zone, counts in {"zb": [1] * 14 + [0] * 1986, "zc": [1] * 2000}.items():
        (traces / f"{zone}_v100_1.json").write_text(
            json.dumps({"metadata": {"gap_seconds": 10}, "data": counts})
        )
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "sweep-test", "workers": 2, "trials": 8, "study": "digits",
        "storage": "sqlite:///sweep.db", "run_root": "runs", "market": "spot", "max_restarts": 3,
        "command": f"python {EXAMPLE} --trials $SPOTWISE_TRIALS --storage $SPOTWISE_STUDY_STORAGE"
                   " --study $SPOTWISE_STUDY --run-root $SPOTWISE_RUN_ROOT"
                   f" --worker $SPOTWISE_WORKER {' '.join(ARGS)}",
        "provider": {"name": "sim", "trace": str(traces), "zones": ["zb", "zc"],
                     "time_compression": 10, "notice_s": 1.5, "boot_s": 0,
                     "spot_usd_per_hour": 1.0, "ondemand_usd_per_hour": 3.0},
    }))  # fmt: skip
    proc = subprocess.Popen([*SPOTWISE, "sweep", str(sweep)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    killed = _kill_one_mid_trial(tmp_path / "sweep.db", tmp_path / "runs", random.Random(16), proc)
    out, _ = proc.communicate(timeout=400)
    assert proc.returncode == 0, out

    status = subprocess.run(
        [*SPOTWISE, "sweep", "status", "--json"], capture_output=True, text=True, timeout=60
    )
    doc = json.loads(status.stdout)
    trials = doc["trials"]
    assert [(t["number"], t["state"]) for t in trials] == [(i, "COMPLETE") for i in range(8)]
    assert f"study-sha256: {doc['study_sha256']}" == reference
    assert len(trials[killed]["attempts"]) >= 2, "the killed trial was continued"
    resumed = [t for t in trials if t["resumed_steps"]]
    assert resumed and all(len(t["attempts"]) >= 2 for t in resumed)
    assert all(s > 0 for t in resumed for s in t["resumed_steps"]), "resumed, not restarted"
    assert sum(t["cost_usd"] for t in trials) > 0
    table = subprocess.run(
        [*SPOTWISE, "sweep", "status"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    ).stdout
    assert "COMPLETE" in table and "resumed at" in table
