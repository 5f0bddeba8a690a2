"""Exact resume for the loop shapes users write, with real processes: gradient accumulation
(K=4, killed inside a window), torchdata's StatefulDataLoader over a stateful IterableDataset
(workers 0 and 2), a Hugging Face ``datasets`` stream built in memory, and an eval pass mid
training with Generators in ``run.extras`` (killed during the evaluation), and a Hugging Face
Accelerate loop (``accelerator.accumulate``, killed inside a window). Each is killed with
SIGKILL to the main PID, SIGKILL to the process group and SIGTERM, restarted each time, and ends
with the uninterrupted run's weights and the same loss at every (step, micro-batch)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

CHILD = Path(__file__).with_name("_child.py")
PATTERNS = ("SIGKILL main", "SIGKILL group", "SIGTERM main")
EXIT_INTERRUPTED = 75

pytestmark = pytest.mark.e2e


def launch(run_dir: Path, trace: Path, mode: str, workers: int) -> subprocess.Popen[str]:
    env = dict(os.environ, SPOTWISE_PLATFORM="none", HF_DATASETS_OFFLINE="1")
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(run_dir), str(trace), mode, str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,  # its own process group, like a job step
    )


def lines(trace: Path) -> list[dict[str, Any]]:
    if not trace.exists():
        return []
    return [json.loads(line) for line in trace.read_text().splitlines() if line]


def final_hash(out: str) -> str:
    (line,) = [x for x in out.splitlines() if x.startswith("final-weights-sha256: ")]
    return line.split(": ", 1)[1]


def losses(records: list[dict[str, Any]]) -> dict[tuple[int, int], tuple[str, str | None]]:
    """Loss (and eval loss) per (step, micro-batch); a replayed record must equal the first."""
    seen: dict[tuple[int, int], tuple[str, str | None]] = {}
    for r in records:
        if "loss" not in r:
            continue
        key, value = (r["step"], r["micro"]), (r["loss"], r.get("eval"))
        assert seen.setdefault(key, value) == value, f"step {key} differs on replay"
    return seen


def moment(mode: str, records: list[dict[str, Any]], start: int, target: int) -> bool:
    """Where to strike: past the first checkpoint, ``target`` records into this start, and
    inside an accumulation window / inside an evaluation where the mode has one."""
    new = records[start:]
    if mode == "eval":  # the first evaluation of this start (there are four in the run)
        target = 1
    if len(new) < target or not new or new[-1].get("step", new[-1].get("evaluating")) < 3:
        return False
    last = new[-1]
    if mode == "accumulate":
        return last["micro"] in (1, 2)  # micro-batches 2-3 of 4 are running next
    if mode == "accelerate":
        return last["micro"] == 0  # the window's second micro-batch is running next
    if mode == "eval":
        return "evaluating" in last
    return True


def strike(child: subprocess.Popen[str], pattern: str) -> tuple[str, str]:
    """Send the signal of ``pattern`` (one of PATTERNS) and wait for the child to end."""
    if pattern == "SIGKILL group":
        os.killpg(child.pid, signal.SIGKILL)
    else:
        os.kill(child.pid, signal.SIGKILL if "KILL" in pattern else signal.SIGTERM)
    return child.communicate(timeout=60)


def interrupted(tmp_path: Path, mode: str, workers: int, seed: int) -> tuple[str, list[dict]]:
    run_dir, trace = tmp_path / "run", tmp_path / "run.jsonl"
    rng = random.Random(seed)
    for pattern in PATTERNS:
        start = len(lines(trace))
        committed = any(run_dir.glob("step-*"))  # checkpoints appear by atomic rename
        child = launch(run_dir, trace, mode, workers)
        target = rng.randint(2, 8)
        deadline = time.monotonic() + 60
        while not moment(mode, lines(trace), start, target):
            assert child.poll() is None, f"{mode}: ended before {pattern}: {child.stderr.read()}"  # type: ignore[union-attr]
            assert time.monotonic() < deadline, f"{mode}: no moment for {pattern}"
            time.sleep(0.005)
        out, err = strike(child, pattern)
        if pattern == "SIGTERM main":
            assert child.returncode == EXIT_INTERRUPTED, err[-3000:]
            assert f"exiting with code {EXIT_INTERRUPTED}" in err
        else:
            assert child.returncode == -signal.SIGKILL, err[-3000:]
        assert ("resumed-from: " in out) == committed, f"{pattern}: resumed {out!r}"
    child = launch(run_dir, trace, mode, workers)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    assert "resumed-from: " in out
    return final_hash(out), lines(trace)


@pytest.mark.parametrize(
    ("mode", "workers"),
    [
        ("accumulate", 0),
        ("stateful", 0),
        ("stateful", 2),
        ("hf", 0),
        ("eval", 0),
        ("accelerate", 0),
    ],
)
def test_killed_runs_end_like_the_uninterrupted_one(
    tmp_path: Path, mode: str, workers: int
) -> None:
    reference = launch(tmp_path / "ref", tmp_path / "ref.jsonl", mode, workers)
    out, err = reference.communicate(timeout=120)
    assert reference.returncode == 0, err[-3000:]
    reference_losses = losses(lines(tmp_path / "ref.jsonl"))
    digest, records = interrupted(tmp_path, mode, workers, seed=sum(map(ord, mode)) + workers)
    assert digest == final_hash(out)
    assert losses(records) == reference_losses
    if mode == "eval":
        # the kills land inside an evaluation, before its step's record: what they replay is
        # the evaluation (whether a training record repeats too depends on whether the even
        # step's background save had committed, which is timing)
        assert sum("evaluating" in r for r in records) > len(
            [k for k in reference_losses if k[0] % 5 == 0]
        )
    else:  # the kills really replayed work: some (step, micro) ran twice
        keys = [(r["step"], r["micro"]) for r in records if "loss" in r]
        assert len(keys) > len(set(keys))
