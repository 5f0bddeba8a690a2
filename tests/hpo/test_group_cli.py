"""Worker-group commands as a user runs them: bad sweep / batch files are one clear error before
anything is launched, and the group's budget stops every worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPOTWISE, *args], capture_output=True, text=True, timeout=180,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip


def _jobs() -> list[dict]:
    return json.loads(_cli("jobs", "--json").stdout)


def test_unreachable_study_storage_is_refused_before_launching(tmp_path: Path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(yaml.safe_dump({
        "name": "s", "workers": 2, "trials": 4, "command": "python -c pass",
        "storage": f"sqlite:///{tmp_path}/no/such/dir/sweep.db"}))  # fmt: skip
    out = _cli("sweep", str(sweep))
    assert out.returncode == 2 and "cannot reach the study storage" in out.stderr, out.stderr
    assert _jobs() == []


def test_bad_group_fields_name_the_field(tmp_path: Path):
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("name: s\nworkers: 0\ntrials: 4\ncommand: python -c pass\n")
    out = _cli("sweep", str(sweep))
    assert out.returncode == 2 and "workers must be a whole number" in out.stderr
    batch = tmp_path / "infer.yaml"
    batch.write_text("name: b\nworkers: 2\ncommand: python -c pass\n")
    out = _cli("infer", str(batch))
    assert out.returncode == 2 and "required field 'output'" in out.stderr
    status = _cli("sweep", "status")
    assert status.returncode == 2 and "no sweep has been started here" in status.stderr


def test_the_group_budget_cancels_every_worker(tmp_path: Path):
    traces = tmp_path / "traces"
    traces.mkdir()
    (traces / "zc_v100_1.json").write_text(
        json.dumps({"metadata": {"gap_seconds": 10}, "data": [1] * 100})
    )
    script = tmp_path / "work.py"
    script.write_text("import signal, sys, time\n"
                      "signal.signal(signal.SIGTERM, lambda *_: sys.exit(75))\n"
                      "time.sleep(120)\n")  # fmt: skip
    batch = tmp_path / "infer.yaml"
    batch.write_text(yaml.safe_dump({
        "name": "b", "workers": 2, "output": "out", "command": f"python {script}",
        "market": "spot", "budget_usd": 0.05,
        "provider": {"name": "sim", "trace": str(traces), "zones": ["zc"],
                     "time_compression": 10, "boot_s": 0, "spot_usd_per_hour": 36.0,
                     "ondemand_usd_per_hour": 72.0},
    }))  # fmt: skip
    out = _cli("infer", str(batch))
    assert out.returncode == 1
    assert "stopped: budget $0.05 spent" in out.stdout, out.stdout
    jobs = _jobs()
    assert len(jobs) == 2 and {j["state"] for j in jobs} == {"CANCELLED"}
    assert sum(j["cost_usd"] for j in jobs) < 0.05 + 2 * 36.0 * 10 / 3600 * 3, "stopped promptly"
