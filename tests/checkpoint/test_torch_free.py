"""Reading checkpoints never loads torch: the controller, the storage backends and the CLI's
read-only commands work in a fresh interpreter that never imports it (seconds saved on every
``spotwise ckpt list`` and at every start of a controller)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from spotwise.control.store import Store
from spotwise.runtime.commit import write_checkpoint

# Runs in a fresh interpreter: every import and command below, then whether torch got loaded.
CHILD = """
import json, sys
import spotwise.storage, spotwise.storage.local, spotwise.control.controller, spotwise.checkpoint
from typer.testing import CliRunner
from spotwise.cli.main import app
from spotwise.control.progress import read_committed

run_dir, job_id = sys.argv[1], sys.argv[2]
runner = CliRunner()
outputs = {
    " ".join(args): runner.invoke(app, args)
    for args in (
        ["ckpt", "list", run_dir, "--json"],
        ["ckpt", "list", run_dir],
        ["jobs", "--json"],
        ["status", job_id, "--json"],
    )
}
print(json.dumps({
    "codes": {name: r.exit_code for name, r in outputs.items()},
    "listed": json.loads(outputs[f"ckpt list {run_dir} --json"].output),
    "committed": read_committed(run_dir).step,
    "torch": "torch" in sys.modules,
}))
"""


def test_reading_checkpoints_loads_no_torch(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for step in (10, 20):
        write_checkpoint(run_dir, step, {"w": torch.ones(4)}, {"step": step})
    spec = {"command": ["python", "train.py"], "provider": "local", "name": "reader"}
    job = Store().create_job("reader", spec, None, now=time.time())

    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(run_dir), job.id],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert out.returncode == 0, out.stderr
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(found["codes"].values()) == {0}, found["codes"]
    assert [(c["step"], c["valid"]) for c in found["listed"]] == [(10, True), (20, True)]
    assert found["committed"] == 20
    assert found["torch"] is False
