"""Soak: kill the digits example over and over, in every real way and at random moments, restart
it at once each time, and check that it still ends bit-identical to an uninterrupted run.

    python benchmarks/soak.py --kills 100 [--seed 1] [--workers 0,2]

Each launch resumes the same run directory with a random number of DataLoader workers and gets
one kill pattern (:data:`PATTERNS`: SIGKILL to the main PID only or to the process group,
SIGTERM, SIGINT or SIGUSR1 to the main PID or the group, a group SIGTERM with one worker
SIGKILLed) at a random moment: while the interpreter starts, at a random step, or in the
middle of a save (a failpoint holds saves open). The next launch starts as soon as the main
process has exited, while orphaned workers may still be exiting. Checked at every launch: it
resumed from the newest valid checkpoint; a signal that came after training started ended in
exit 75 with the emergency checkpoint at the step where it stopped; every step it ran saw the
uninterrupted run's batch and loss. When a run reaches its last step, its final weights hash is
compared and a new run directory starts. The last line is

    soak: N kills, M restarts, identical

or ``soak: diverged ...`` (exit 1) naming the kill, the pattern, the moment and what differed.
The e2e kill-pattern test (tests/e2e/test_exact_resume.py) drives the same harness in a fixed
order.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from spotwise.control.providers.process import lock_held
from spotwise.runtime import list_checkpoints
from spotwise.telemetry.events import read_events

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "digits" / "train.py"
STEPS = 400  # room for every pattern even when a loaded machine notices each moment late
SAVE_EVERY = 15
BATCHES_PER_EPOCH = 45  # 1,438 training images in batches of 32: resumes land mid-epoch
STEP_SLEEP = 0.005
TIMEOUT_S = 240.0
SLURM_SIGNALS = {"SPOTWISE_SIGNALS": "TERM,INT,USR1"}  # as SLURM users set it


@dataclass(frozen=True)
class Pattern:
    name: str
    signum: signal.Signals
    group: bool  # the whole process group, or the main PID only
    kill_a_worker: bool = False  # SIGKILL one DataLoader worker at the same moment

    @property
    def is_kill(self) -> bool:
        return self.signum == signal.SIGKILL


PATTERNS = (
    Pattern("SIGKILL to the main PID", signal.SIGKILL, group=False),
    Pattern("SIGKILL to the group", signal.SIGKILL, group=True),
    Pattern("SIGTERM to the main PID", signal.SIGTERM, group=False),
    Pattern("SIGTERM to the group", signal.SIGTERM, group=True),
    Pattern("SIGINT to the main PID", signal.SIGINT, group=False),
    Pattern("SIGINT to the group", signal.SIGINT, group=True),
    Pattern("SIGUSR1 to the main PID", signal.SIGUSR1, group=False),
    Pattern("SIGUSR1 to the group", signal.SIGUSR1, group=True),
    Pattern("SIGTERM to the group, a worker SIGKILLed", signal.SIGTERM, True, kill_a_worker=True),
)


@dataclass
class Child:
    """A started training process in a session of its own. Its output goes to files, not
    pipes: orphaned workers hold a pipe open, and reading it to the end would wait for them."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path
    trace: Path
    trace_start: int  # trace lines before it started

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc.poll() is None

    def stepped(self) -> int:
        """Steps this process has finished so far."""
        return trace_lines(self.trace) - self.trace_start

    def workers(self) -> set[int]:
        return group_members(self.pid) - {self.pid}

    def finish(self) -> tuple[int, str, str]:
        """Wait for the main process only; (exit code, stdout, stderr)."""
        rc = self.proc.wait(timeout=TIMEOUT_S)
        return rc, self.out.read_text(), self.err.read_text()


def launch(run_dir: Path, trace: Path, workers: int, env: dict[str, str] | None = None) -> Child:
    cmd = [
        sys.executable, str(EXAMPLE), "--run-dir", str(run_dir), "--steps", str(STEPS),
        "--save-every", str(SAVE_EVERY), "--workers", str(workers),
        "--step-sleep", str(STEP_SLEEP), "--trace", str(trace),
    ]  # fmt: skip
    number = len(list(trace.parent.glob(f"{trace.stem}-*.out")))
    out, err = (trace.parent / f"{trace.stem}-{number}.{kind}" for kind in ("out", "err"))
    full_env = {**os.environ, "SPOTWISE_PLATFORM": "none", **(env or {})}
    start = trace_lines(trace)
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            cmd, stdout=stdout, stderr=stderr, env=full_env, start_new_session=True
        )
    return Child(proc, out, err, trace, start)


def deliver(child: Child, pattern: Pattern) -> set[int]:
    """Send the pattern's signal(s); returns the workers that were alive just before."""
    workers = child.workers()
    try:
        if pattern.kill_a_worker and workers:
            os.kill(min(workers), signal.SIGKILL)
        if pattern.group:
            os.killpg(child.pid, pattern.signum)
        else:
            os.kill(child.pid, pattern.signum)
    except ProcessLookupError:  # it finished just now
        pass
    return workers


def wait_until(condition: Callable[[], bool], child: Child, what: str) -> bool:
    """Poll until ``condition``; False if the process ended first."""
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if not child.running():
            return False
        if time.monotonic() > deadline:
            os.killpg(child.pid, signal.SIGKILL)
            raise TimeoutError(f"timed out waiting for {what}")
        time.sleep(0.002)
    return True


def group_members(pgid: int) -> set[int]:
    """Live processes of a process group (zombies excluded), from /proc."""
    members = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state, _ppid, group = stat.rsplit(")", 1)[1].split()[:3]
        if int(group) == pgid and state != "Z":
            members.add(int(entry))
    return members


def lock_is_free(run_dir: Path) -> bool:
    return not lock_held(run_dir / ".lock")


def trace_lines(trace: Path) -> int:
    return len(trace.read_text().splitlines()) if trace.exists() else 0


def read_trace(trace: Path) -> list[dict]:
    return [json.loads(line) for line in trace.read_text().splitlines()] if trace.exists() else []


def last_step(trace: Path) -> int:
    records = read_trace(trace)
    return records[-1]["step"] if records else 0


def saving(run_dir: Path) -> bool:
    return run_dir.exists() and any(p.name.startswith(".tmp-step-") for p in run_dir.iterdir())


def newest_valid(run_dir: Path) -> int:
    if not run_dir.exists():
        return 0
    valid = [c.step for c in list_checkpoints(run_dir) if c.valid]
    return valid[-1] if valid else 0


def resumed_steps(stdout: str) -> list[int]:
    return [int(line.split()[-1]) for line in stdout.splitlines() if line.startswith("resumed")]


def final_hash(stdout: str) -> str | None:
    lines = stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("final-weights-sha256: "):
        return None
    return lines[-1].split(": ", 1)[1]


def divergence(reference: list[dict], records: list[dict]) -> str | None:
    """Where ``records`` (steps of interrupted runs, repeats included) leave the reference."""
    expected = {r["step"]: r for r in reference}
    for record in records:
        want = expected.get(record["step"])
        if want is None:
            return f"step {record['step']} is not a step of the uninterrupted run"
        for name in ("epoch", "batch", "loss"):
            if record[name] != want[name]:
                return (
                    f"step {record['step']} (epoch {want['epoch']}): {name} {record[name]!r}, "
                    f"uninterrupted {want[name]!r}"
                )
    return None


def ending_problem(
    pattern: Pattern, rc: int, out: str, err: str, run_dir: Path, stepped: bool
) -> str | None:
    """What is wrong with how a process ended after ``pattern`` (None: as promised). ``stepped``:
    it had trained, so its notice handlers were in place when the signal came."""
    if rc == 0 or (final_hash(out) is not None and rc == -pattern.signum):
        return None  # it had finished (and closed its Run) before the signal could matter
    if pattern.is_kill:
        return None if rc == -signal.SIGKILL else f"exit {rc} after SIGKILL"
    if not stepped and rc == -pattern.signum:
        return None  # before Run() installed its handlers, the signal's default action applies
    if rc != 75:
        return f"exit {rc}, not 75, after {pattern.signum.name}:\n{err[-2000:]}"
    if "exiting with code 75" not in err or "Traceback" in err:
        return f"exit 75 without the emergency checkpoint line, or with a traceback:\n{err[-2000:]}"
    interrupted = read_events(run_dir / "events.jsonl", "interrupted")
    if not interrupted or interrupted[-1]["action"] != pattern.signum.name:
        return f"no interrupted event for {pattern.signum.name}"
    if newest_valid(run_dir) != interrupted[-1]["step"]:
        return (
            f"interrupted at step {interrupted[-1]['step']}, but the newest valid checkpoint "
            f"is step {newest_valid(run_dir)}"
        )
    return None


@dataclass
class Soak:
    base: Path
    rng: random.Random
    workers: tuple[int, ...]
    reference_hash: str = ""
    reference: list[dict] = field(default_factory=list)
    kills: int = 0
    restarts: int = 0  # launches after the first one of a run directory
    rounds: int = 0  # run directories started
    round_launches: int = 0
    finished: int = 0
    counts: dict[str, int] = field(default_factory=dict)

    def launch(self, workers: int, env: dict[str, str]) -> Child:
        run_dir, trace = self.run_dir()
        self.restarts += 1 if self.round_launches else 0
        self.round_launches += 1
        return launch(run_dir, trace, workers, env)

    def run_dir(self) -> tuple[Path, Path]:
        return self.base / f"run-{self.rounds}", self.base / f"trace-{self.rounds}.jsonl"

    def new_round(self) -> None:
        self.rounds += 1
        self.round_launches = 0

    def measure_reference(self) -> None:
        child = launch(self.base / "reference", self.base / "reference.jsonl", 0)
        rc, out, err = child.finish()
        digest = final_hash(out)
        if rc != 0 or digest is None:
            raise SystemExit(f"soak: the uninterrupted run failed (exit {rc}):\n{err[-2000:]}")
        self.reference_hash, self.reference = digest, read_trace(child.trace)

    def one_kill(self) -> str | None:
        """Launch (resuming), interrupt with a random pattern at a random moment; a problem
        or None."""
        run_dir, trace = self.run_dir()
        pattern = self.rng.choice(PATTERNS)
        moment = self.rng.choices(["startup", "step", "save"], weights=[1, 3, 2])[0]
        env = dict(SLURM_SIGNALS)
        if moment == "save":
            env["SPOTWISE_TEST_WRITE_DELAY_S"] = "0.3"
        resume_point = newest_valid(run_dir)
        workers = self.rng.choice(self.workers)
        child = self.launch(workers, env)
        where = f"kill {self.kills + 1} ({pattern.name} at {moment}, workers={workers})"
        if moment == "startup":
            time.sleep(self.rng.uniform(0.0, 3.0))
            reached = child.running()
        elif moment == "step":
            target = self.rng.randint(1, 30)
            reached = wait_until(lambda: child.stepped() >= target, child, where)
        else:
            reached = wait_until(lambda: child.stepped() > 0 and saving(run_dir), child, where)
        alive = deliver(child, pattern) if reached else set()
        stepped = child.stepped() > 0
        rc, out, err = child.finish()
        if reached:
            self.kills += 1
            self.counts[pattern.name] = self.counts.get(pattern.name, 0) + 1
        if stepped and resumed_steps(out) != ([resume_point] if resume_point else []):
            return f"{where}: resumed from {resumed_steps(out)}, newest valid was {resume_point}"
        if "another process" in err:
            return f"{where}: the restart was refused:\n{err[-2000:]}"
        problem = ending_problem(pattern, rc, out, err, run_dir, stepped) if reached else None
        if problem is None and pattern.is_kill and not pattern.group and alive:
            stale = alive & group_members(child.pid)
            if stale and not lock_is_free(run_dir):
                problem = f"stale workers {sorted(stale)} keep the run directory locked"
        if problem is None:
            problem = divergence(self.reference, read_trace(trace))
        if problem is None and final_hash(out) is not None:
            problem = self.finish_round(out)
        return None if problem is None else f"{where}: {problem}"

    def finish_round(self, stdout: str) -> str | None:
        digest = final_hash(stdout)
        if digest != self.reference_hash:
            return f"final weights {digest}, uninterrupted {self.reference_hash}"
        _, trace = self.run_dir()
        if {r["step"] for r in read_trace(trace)} != {r["step"] for r in self.reference}:
            return "the interrupted runs together did not run every step"
        self.finished += 1
        self.new_round()
        return None

    def run_to_end(self) -> str | None:
        run_dir, trace = self.run_dir()
        resume_point = newest_valid(run_dir)
        child = self.launch(self.rng.choice(self.workers), dict(SLURM_SIGNALS))
        rc, out, err = child.finish()
        if rc != 0:
            return f"the last run exited {rc}:\n{err[-2000:]}"
        if resume_point and resumed_steps(out) != [resume_point]:
            return f"the last run resumed from {resumed_steps(out)}, not {resume_point}"
        return divergence(self.reference, read_trace(trace)) or self.finish_round(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kills", type=int, required=True, help="how many kills to deliver")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--workers", default="0,2", help="DataLoader worker counts to draw from")
    parser.add_argument("--dir", default=None, help="keep run directories and logs here")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    workers = tuple(int(w) for w in args.workers.split(","))
    base = Path(args.dir or tempfile.mkdtemp(prefix="spotwise-soak-"))
    base.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    soak = Soak(base, random.Random(seed), workers)
    soak.measure_reference()
    soak.new_round()
    problem = None
    while problem is None and soak.kills < args.kills:
        problem = soak.one_kill()
    if problem is None:
        problem = soak.run_to_end()
    wall = time.monotonic() - started
    print(f"seed: {seed}")
    print(f"runs finished: {soak.finished}")
    for name, count in sorted(soak.counts.items()):
        print(f"pattern: {name}: {count}")
    print(f"wall-s: {wall:.1f}")
    if problem is not None:
        print(f"soak: diverged at {problem}")
        print(f"logs: {base}")
        return 1
    print(f"soak: {soak.kills} kills, {soak.restarts} restarts, identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
