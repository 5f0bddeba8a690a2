"""Bit-exact resume with real processes: the digits example killed (SIGKILL at random moments,
one in the middle of a save, and SIGTERM -> exit 75) and restarted until it finishes ends with
the same weights as an uninterrupted run, and every step it ran saw the same batch and loss."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwise.runtime import list_checkpoints
from spotwise.telemetry.events import read_events

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "digits" / "train.py"
STEPS = 200
SAVE_EVERY = 15  # 45 batches per epoch: most resumes land mid-epoch
STEP_SLEEP = 0.005
TIMEOUT_S = 240.0

pytestmark = pytest.mark.e2e


def launch(run_dir: Path, trace: Path, workers: int, **env: str) -> subprocess.Popen[str]:
    cmd = [
        sys.executable, str(EXAMPLE), "--run-dir", str(run_dir), "--steps", str(STEPS),
        "--save-every", str(SAVE_EVERY), "--workers", str(workers),
        "--step-sleep", str(STEP_SLEEP), "--trace", str(trace),
    ]  # fmt: skip
    full_env = {**os.environ, "SPOTWISE_PLATFORM": "none", **env}
    return subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env
    )


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=TIMEOUT_S)
    return proc.returncode, out, err


def final_hash(stdout: str) -> str:
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("final-weights-sha256: "), stdout[-2000:]
    return last.split(": ", 1)[1]


def trace_lines(trace: Path) -> int:
    return len(trace.read_text().splitlines()) if trace.exists() else 0


def wait_until(condition, proc: subprocess.Popen[str], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"process ended (rc {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.002)


def read_trace(trace: Path) -> list[dict]:
    return [json.loads(line) for line in trace.read_text().splitlines()]


def assert_same_steps(reference: list[dict], interrupted: list[dict]) -> None:
    expected = {r["step"]: r for r in reference}
    assert len(expected) == STEPS
    for record in interrupted:
        want = expected[record["step"]]
        for field in ("epoch", "batch", "loss"):
            assert record[field] == want[field], (
                f"diverged at step {record['step']} (epoch {want['epoch']}): {field} "
                f"{record[field]!r} != uninterrupted {want[field]!r}"
            )
    assert {r["step"] for r in interrupted} == set(expected)


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    """The uninterrupted run (workers do not change the data order, so one serves both)."""
    base = tmp_path_factory.mktemp("reference")
    rc, out, err = finish(launch(base / "run", base / "trace.jsonl", 0))
    assert rc == 0, err[-3000:]
    return final_hash(out), read_trace(base / "trace.jsonl")


def resumed_steps(stdout: str) -> list[int]:
    return [int(line.split()[-1]) for line in stdout.splitlines() if line.startswith("resumed")]


def newest_valid(run_dir: Path) -> int:
    valid = [c.step for c in list_checkpoints(run_dir) if c.valid]
    return valid[-1] if valid else 0


@pytest.mark.parametrize("workers", [0, 2])
def test_killed_and_restarted_run_ends_bit_identical(
    tmp_path: Path, workers: int, reference: tuple[str, list[dict]]
) -> None:
    reference_hash, reference_trace = reference
    rng = random.Random(20261129 + workers)
    run_dir, trace = tmp_path / "run", tmp_path / "run.jsonl"

    # 1. SIGKILL at a random step, once the first checkpoint (step 15) has committed
    proc = launch(run_dir, trace, workers)
    target = rng.randint(20, 44)
    wait_until(
        lambda: trace_lines(trace) >= target and newest_valid(run_dir) > 0, proc, f"step {target}"
    )
    time.sleep(rng.uniform(0, 0.02))
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    resume_point = newest_valid(run_dir)
    assert resume_point % 45, "the first resume should land mid-epoch"

    # 2. SIGKILL in the middle of a save (the failpoint holds each save open for 0.5 s)
    proc = launch(run_dir, trace, workers, SPOTWISE_TEST_WRITE_DELAY_S="0.5")
    start = trace_lines(trace)

    def saving() -> bool:
        return trace_lines(trace) > start and any(
            p.name.startswith(".tmp-step-") for p in run_dir.iterdir()
        )

    wait_until(saving, proc, "a save in progress")
    proc.send_signal(signal.SIGKILL)
    rc, out, _ = finish(proc)
    assert resumed_steps(out) == [resume_point]
    resume_point = newest_valid(run_dir)  # the half-written save does not count

    if workers == 0:  # (the test-time budget affords these once)
        # 3. SIGTERM at a random step: the notice watcher turns it into a save and exit 75
        proc = launch(run_dir, trace, workers)
        start = trace_lines(trace)
        target = start + rng.randint(10, 40)
        wait_until(lambda: trace_lines(trace) >= target, proc, f"trace line {target}")
        proc.send_signal(signal.SIGTERM)
        rc, out, err = finish(proc)
        assert rc == 75, f"SIGTERM should exit 75 after saving, got {rc}: {err[-2000:]}"
        assert "exiting with code 75" in err
        assert resumed_steps(out) == [resume_point]
        interrupted = read_events(run_dir / "events.jsonl", "interrupted")[-1]["step"]
        assert newest_valid(run_dir) == interrupted  # saved where it stopped
        resume_point = interrupted

    # 4. run to the end
    rc, out, err = finish(launch(run_dir, trace, workers))
    assert rc == 0, err[-3000:]
    assert resumed_steps(out) == [resume_point]
    assert final_hash(out) == reference_hash
    assert_same_steps(reference_trace, read_trace(trace))
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".tmp-")]

    if workers == 0:
        # a finished run directory: same line, exit 0, no training
        lines = trace_lines(trace)
        rc, out, _ = finish(launch(run_dir, trace, workers))
        assert rc == 0 and final_hash(out) == reference_hash and trace_lines(trace) == lines
