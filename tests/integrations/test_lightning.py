"""The Lightning callback with the real ``lightning`` package on CPU and real processes: a
``LightningDataModule`` with two loader workers, bf16-mixed precision, dropout, AdamW and a
per-step LR schedule. Killed with SIGKILL to the main PID, SIGKILL to the process group and
SIGTERM (exit 75 after a committed checkpoint), restarted each time, it ends with the
uninterrupted run's weights and the same loss at every step; Lightning's own resume
(``ModelCheckpoint`` + ``ckpt_path="last"``) on the same script does not."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from .test_resume_shapes import EXIT_INTERRUPTED, PATTERNS, final_hash, lines

CHILD = Path(__file__).with_name("_lightning_child.py")
WORKERS = 2

pytestmark = pytest.mark.e2e


def launch(run_dir: Path, trace: Path, mode: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(run_dir), str(trace), mode, str(WORKERS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, SPOTWISE_PLATFORM="none"),
        start_new_session=True,
    )


def finish(child: subprocess.Popen[str]) -> str:
    out, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-3000:]
    return out


def per_step(records: list[dict[str, Any]]) -> dict[int, tuple[float, float]]:
    """(loss, batch sum) per global step; a replayed step must equal its first run."""
    seen: dict[int, tuple[float, float]] = {}
    for r in records:
        value = (r["loss"], r["x"])
        assert seen.setdefault(r["step"], value) == value, f"step {r['step']} differs on replay"
    return seen


def interrupted(
    tmp_path: Path, mode: str, at: tuple[int, ...], patterns: tuple[str, ...] = PATTERNS
) -> tuple[str, list[dict]]:
    """Kill a run of ``mode`` once per pattern, when its trace reaches the next of ``at``
    lines, restarting it each time; then let it finish."""
    run_dir, trace = tmp_path / mode, tmp_path / f"{mode}.jsonl"
    for pattern, target in zip(patterns, at, strict=True):
        child = launch(run_dir, trace, mode)
        while len(lines(trace)) < target:
            assert child.poll() is None, f"{mode} ended before {pattern}: {child.stderr.read()}"  # type: ignore[union-attr]
            time.sleep(0.005)
        if pattern == "SIGKILL group":
            os.killpg(child.pid, signal.SIGKILL)
        else:
            os.kill(child.pid, signal.SIGKILL if "KILL" in pattern else signal.SIGTERM)
        out, err = child.communicate(timeout=60)
        if mode == "spotwise" and pattern == "SIGTERM main":
            assert child.returncode == EXIT_INTERRUPTED, err[-3000:]
            assert f"exiting with code {EXIT_INTERRUPTED}" in err
        elif "KILL" in pattern:
            assert child.returncode == -signal.SIGKILL, err[-3000:]
    out = finish(launch(run_dir, trace, mode))
    assert "resumed-from: " in out
    return final_hash(out), lines(trace)


# trace lines at which to strike: mid-epoch (5 batches an epoch), then right after a
# checkpoint at an epoch's end (step 10), then mid-epoch again
STRIKES = (4, 9, 13)


def test_killed_fit_ends_like_the_uninterrupted_one(tmp_path: Path) -> None:
    reference = finish(launch(tmp_path / "ref", tmp_path / "ref.jsonl", "spotwise"))
    expected = per_step(lines(tmp_path / "ref.jsonl"))
    digest, records = interrupted(tmp_path, "spotwise", STRIKES)
    assert per_step(records) == expected
    assert digest == final_hash(reference)
    assert len(records) > len(expected)  # the kills really replayed steps


def test_plain_lightning_resume_differs_on_the_same_script(tmp_path: Path) -> None:
    reference = finish(launch(tmp_path / "ref", tmp_path / "ref.jsonl", "plain"))
    expected = {r["step"]: (r["loss"], r["x"]) for r in lines(tmp_path / "ref.jsonl")}
    digest, records = interrupted(tmp_path, "plain", STRIKES[:1], PATTERNS[:1])
    resumed = {r["step"]: (r["loss"], r["x"]) for r in records}  # the last run of each step
    assert digest != final_hash(reference)
    assert resumed != expected
