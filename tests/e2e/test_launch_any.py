"""The "any framework" jobs end to end: ``spotwise launch`` on the sim provider of a plain shell
job (examples/any), a JAX/Flax script checkpointing with Orbax (examples/jax) and a Keras 3
script with ``BackupAndRestore`` (examples/keras), each under ``spotwise run``, preempted by a
real trace's capacity loss, relaunched, resumed from its own checkpoint (not from the start) and
finished with the result of the same script never interrupted."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from spotwise.control.spec import load_spec
from spotwise.exitcode import EXIT_INTERRUPTED

from .conftest import HASH, cli

ROOT = Path(__file__).resolve().parents[2]
JOB = ROOT / "examples" / "any" / "job.yaml"
JAX_JOB = ROOT / "examples" / "jax" / "job.yaml"
KERAS_JOB = ROOT / "examples" / "keras" / "job.yaml"
PY_JOBS = (JAX_JOB, KERAS_JOB)
CHECKSUM = re.compile(r"final-checksum: (\d+)")
DOC = ROOT / "docs" / "integrations.md"


def test_the_docs_show_the_example_as_it_is() -> None:
    doc = DOC.read_text()
    for path in (JOB.parent / "train.sh", JOB, *(job.parent / "train.py" for job in PY_JOBS)):
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
    # a machine taken back just after the script ended reruns its end: every end is the same
    assert set(CHECKSUM.findall(logs)) == set(CHECKSUM.findall(alone.stdout))


def with_venv() -> dict[str, str]:
    """The environment with this interpreter first on PATH: the jobs' programs start as
    ``python train.py`` under ``spotwise run``, as with the virtualenv active."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def alone(job: Path, run_dir: Path) -> str:
    """The final hash of the job's program run by itself, never interrupted, without the
    per-step sleep that gives the market time to strike."""
    spec = load_spec(job)
    program = spec.command[spec.command.index("--") + 1 :]
    argv = [sys.executable if a == "python" else a for a in program]
    argv = [a.replace("$SPOTWISE_CHECKPOINT_DIR", str(run_dir)) for a in argv]
    done = subprocess.run(
        [*argv, "--step-sleep", "0"],
        cwd=spec.workdir,
        env={**os.environ, **spec.env},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return HASH.findall(done.stdout)[-1]


@pytest.mark.e2e
def test_jax_job_with_orbax_is_preempted_and_resumes_exactly(tmp_path: Path) -> None:
    _, logs = launch_preempted(JAX_JOB, env=with_venv())
    saved = re.findall(r"saved at step (\d+) on the notice", logs)
    resumed = re.findall(r"resumed from step (\d+)", logs)
    # an attempt trained and saved on its notice (a loaded machine may still be importing JAX
    # when the first notice comes: that one saves step 0)
    assert any(int(step) > 0 for step in saved), logs[-3000:]
    # from the step saved on a notice, or the last one, saved as training ended before a notice
    assert resumed[0] == saved[0] and set(resumed) <= {*saved, "300"}
    # a machine taken back just after training ended reruns the end from Orbax's last step:
    # every end prints the same weights as the uninterrupted run
    assert set(HASH.findall(logs)) == {alone(JAX_JOB, tmp_path / "alone")}


@pytest.mark.e2e
def test_keras_job_with_backup_and_restore_is_preempted_and_resumes_exactly(
    tmp_path: Path,
) -> None:
    _, logs = launch_preempted(KERAS_JOB, env=with_venv())
    epochs = re.findall(r"resumed from the backup at epoch (\d+)", logs)
    assert epochs and int(epochs[0]) > 0, logs[-3000:]  # not started over
    # a notice just after training ended relaunches it once more (restoring the last epoch's
    # backup, which the script keeps): each end has the same weights
    assert set(HASH.findall(logs)) == {alone(KERAS_JOB, tmp_path / "alone")}


@pytest.mark.e2e
def test_keras_backup_torn_in_its_save_restores_the_one_before_and_ends_the_same(
    tmp_path: Path,
) -> None:
    """Keras writes ``latest.weights.h5`` in place: a notice during the save leaves it torn (as
    in one CI run, which then failed to open it). The example keeps the backup before."""
    program = KERAS_JOB.parent / "train.py"

    def train(backup_dir: Path) -> str:
        argv = [sys.executable, str(program), "--backup-dir", str(backup_dir), "--epochs", "3"]
        done = subprocess.run(
            argv, env=with_venv(), capture_output=True, text=True, timeout=300, check=True
        )
        return done.stdout

    whole = HASH.findall(train(tmp_path / "whole"))[-1]
    for torn_size in (0, 2000):  # the kill came after torn_size bytes of the last save
        backup_dir = tmp_path / f"torn-{torn_size}"
        shutil.copytree(tmp_path / "whole", backup_dir)
        with (backup_dir / "latest.weights.h5").open("r+b") as torn:
            torn.truncate(torn_size)
        again = train(backup_dir)
        assert "resumed from the backup at epoch 2" in again  # the backup before the torn one
        assert HASH.findall(again) == [whole]
