"""The "any framework" job end to end: ``spotwise launch examples/any/job.yaml`` on the sim
provider, a plain shell job under ``spotwise run``, preempted by a real trace's capacity loss,
relaunched, resumed from its own checkpoint and finished with the uninterrupted result. (The JAX
and Keras examples beside it need packages the dev install does not have: they were measured by
hand, docs/integrations.md.)"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from spotwise.control.spec import load_spec
from spotwise.exitcode import EXIT_INTERRUPTED

from .conftest import cli

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "any" / "job.yaml"
CHECKSUM = re.compile(r"final-checksum: (\d+)")
DOC = ROOT / "docs" / "integrations.md"


def test_the_docs_show_the_example_as_it_is() -> None:
    doc = DOC.read_text()
    for path in (JOB.parent / "train.sh", JOB):
        assert f"\n{path.read_text()}```" in doc, f"docs/integrations.md shows an old {path.name}"


def launch_preempted(job: Path, env: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    """Launch ``job``; assert it was preempted through the wrapper and SUCCEEDED; (status,
    logs)."""
    launched = cli("launch", str(job), env=env, timeout=600)
    assert launched.returncode == 0, launched.stdout + launched.stderr
    [record] = json.loads(cli("jobs", "--json").stdout)
    status = json.loads(cli("status", record["id"], "--json").stdout)
    assert status["state"] == "SUCCEEDED"
    first, last = status["attempts"][0], status["attempts"][-1]
    # the notice reached the program through the wrapper: it saved and the attempt said 75
    assert (first["reason"], first["exit_code"]) == ("preempted", EXIT_INTERRUPTED)
    assert (last["reason"], last["exit_code"]) == ("succeeded", 0)
    logs = cli("logs", record["id"]).stdout
    assert "spotwise run: notice from signal (SIGTERM)" in logs
    return status, logs


@pytest.mark.e2e
def test_shell_job_under_spotwise_run_is_preempted_and_finishes_exactly(tmp_path: Path) -> None:
    _, logs = launch_preempted(JOB)
    assert re.search(r"saved at step \d+ on the notice \(/\S+notice\.json\)", logs)
    assert "resumed from step" in logs
    alone = subprocess.run(
        ["sh", str(JOB.parent / "train.sh")],
        env={**os.environ, **load_spec(JOB).env, "STATE_DIR": str(tmp_path), "STEP_S": "0"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert CHECKSUM.findall(logs) == CHECKSUM.findall(alone.stdout)
