"""Bit-exact resume under every real kill pattern, with real processes: the digits example, in a
session of its own, is killed in each of the ways below and started again as soon as its main
process has exited, each time resuming from the newest valid checkpoint; it ends with the same
weights as an uninterrupted run, and every step it ran saw the same batch and loss.

The patterns (the soak script's, in a fixed order): SIGKILL to the main PID only (the OOM killer,
``kill -9 PID``: DataLoader workers outlive it for a few seconds and must not keep the run
directory locked), SIGKILL to the process group in the middle of a save, SIGTERM to the main
PID, SIGTERM/SIGINT/SIGUSR1 to the whole group (``kill -TERM -PGID``, SLURM, a container stop,
Ctrl-C): every signal exits 75 with a committed emergency checkpoint at the step where it
stopped, workers or not. With workers also a worker that dies anyway: SIGKILLed with a group
SIGTERM (still exit 75 after saving), and SIGKILLed alone in the final run (the loader restarts
at the same position and the run finishes)."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def _harness():
    spec = importlib.util.spec_from_file_location("spotwise_soak", REPO / "benchmarks/soak.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


soak = _harness()
DURING_A_SAVE = "SIGKILL to the group"  # the others come at a random step


def mid_epoch(trace: Path) -> bool:
    """Away from an epoch's end, where one epoch's workers stop and the next ones start."""
    return 2 < soak.last_step(trace) % soak.BATCHES_PER_EPOCH < soak.BATCHES_PER_EPOCH - 2


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], tuple[str, list]]:
    """The uninterrupted run for each worker count, computed once."""
    done: dict[int, tuple[str, list[dict]]] = {}

    def reference(workers: int) -> tuple[str, list[dict]]:
        if workers not in done:
            base = tmp_path_factory.mktemp(f"reference-{workers}")
            child = soak.launch(base / "run", base / "trace.jsonl", workers)
            rc, out, err = child.finish()
            assert rc == 0, err[-3000:]
            done[workers] = soak.final_hash(out), soak.read_trace(child.trace)
        return done[workers]

    return reference


def interrupt(run_dir: Path, trace: Path, workers: int, pattern, seed: int) -> None:
    """Start the run (resuming), deliver ``pattern`` at its moment, check how it ended."""
    resume_point = soak.newest_valid(run_dir)
    env = dict(soak.SLURM_SIGNALS)
    during_save = pattern.name == DURING_A_SAVE
    if during_save:  # the failpoint holds each save open for 0.5 s
        env["SPOTWISE_TEST_WRITE_DELAY_S"] = "0.5"
    child = soak.launch(run_dir, trace, workers, env)  # right after the previous one exited
    target = random.Random(seed).randint(5, 20)

    def due() -> bool:
        if during_save:
            moment = child.stepped() > 0 and soak.saving(run_dir)
        else:  # a random step after the first checkpoint
            moment = child.stepped() >= target and soak.newest_valid(run_dir) > 0
        return moment and mid_epoch(trace) and len(child.workers()) == workers

    assert soak.wait_until(due, child, pattern.name), f"ended before {pattern.name}"
    alive = soak.deliver(child, pattern)
    rc, out, err = child.finish()
    where = f"{pattern.name}, workers={workers}: rc {rc}\n{err[-3000:]}"
    assert soak.resumed_steps(out) == ([resume_point] if resume_point else []), where
    assert rc != 0, f"{pattern.name} came too late: the run finished"
    assert soak.ending_problem(pattern, rc, out, err, run_dir, stepped=True) is None, where
    if rc == 75:  # no worker's death as an error: only as the loader's restart, when a worker
        # SIGKILLed with the group's SIGTERM was seen dead before the notice had arrived
        deaths = [line for line in err.splitlines() if "killed by signal" in line]
        assert all("restarting the data loader" in line for line in deaths), where
    if workers and pattern.is_kill and not pattern.group:
        # its workers are still exiting, yet the directory is free for the restart
        stale = alive & soak.group_members(child.pid)
        assert stale, "the main-PID SIGKILL should leave its workers behind for a moment"
        assert soak.lock_is_free(run_dir), "a stale worker keeps the run directory locked"
        assert stale & soak.group_members(child.pid), "the workers ended before the lock check"


@pytest.mark.parametrize("workers", [0, 2])
def test_every_kill_pattern_resumes_bit_identical(
    tmp_path: Path, workers: int, references: Callable[[int], tuple[str, list]]
) -> None:
    reference_hash, reference_trace = references(workers)
    run_dir, trace = tmp_path / "run", tmp_path / "run.jsonl"
    for number, pattern in enumerate(soak.PATTERNS):
        if workers or not pattern.kill_a_worker:
            interrupt(run_dir, trace, workers, pattern, seed=20261201 + 10 * workers + number)
            assert soak.divergence(reference_trace, soak.read_trace(trace)) is None

    # run to the end; with workers, one of them is SIGKILLed on the way and replaced
    resume_point = soak.newest_valid(run_dir)
    child = soak.launch(run_dir, trace, workers)
    if workers:

        def ready() -> bool:
            return child.stepped() > 3 and mid_epoch(trace) and len(child.workers()) == workers

        assert soak.wait_until(ready, child, "the final run's workers")
        os.kill(min(child.workers()), signal.SIGKILL)
    rc, out, err = child.finish()
    assert rc == 0, err[-3000:]
    assert soak.resumed_steps(out) == [resume_point]
    if workers:
        assert "restarting the data loader" in err, err[-3000:]
    assert soak.final_hash(out) == reference_hash
    records = soak.read_trace(trace)
    assert soak.divergence(reference_trace, records) is None
    assert {r["step"] for r in records} == {r["step"] for r in reference_trace}
    assert len(reference_trace) == soak.STEPS
    assert not [p for p in run_dir.iterdir() if p.name.startswith(".tmp-")]

    if workers == 0:  # a finished run directory: same line, exit 0, no training
        lines = soak.trace_lines(trace)
        rc, out, _ = soak.launch(run_dir, trace, workers).finish()
        assert rc == 0 and soak.final_hash(out) == reference_hash
        assert soak.trace_lines(trace) == lines
