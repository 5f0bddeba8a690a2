"""DataLoader workers under signals and deaths, in this process with real worker processes: a
notice signal that reaches the workers leaves them running, a terminate notice still saves and
exits 75, and a worker killed mid-epoch is replaced without changing a single batch. Also the
run directory lock: a forked child neither keeps it nor weakens it."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from spotwise.errors import DataLoaderError
from spotwise.notices.signals import SignalDetector, watched_signals
from spotwise.notices.watcher import Watcher
from spotwise.runtime import CheckpointConfig, Run, list_checkpoints

from .conftest import NoisyDataset

STEPS = 24  # NoisyDataset: 70 items in batches of 8 -> 9 batches per epoch


def workers_of_this_process() -> list[int]:
    pid = os.getpid()
    return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def kill_from_another_process(pid: int, signum: signal.Signals) -> None:
    """Not from this process, the workers' parent, whose SIGTERM ends them on purpose."""
    code = f"import os; os.kill({pid}, {int(signum)})"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def batches(run: Run, on_step=None) -> list[str]:
    digests = []
    for x, _y in run:
        digests.append(hashlib.sha1(x.numpy().tobytes()).hexdigest()[:12])
        if on_step is not None:
            on_step(run)
    return digests


def make_run(run_dir: Path, notices=None, workers: int = 2) -> Run:
    loader = DataLoader(NoisyDataset(), batch_size=8, shuffle=True, num_workers=workers)
    return Run(
        run_dir,
        state={"model": torch.nn.Linear(8, 3)},
        loader=loader,
        steps=STEPS,
        checkpoint=CheckpointConfig(every=None),
        seed=7,
        notices=notices,
    )


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    return batches(make_run(tmp_path_factory.mktemp("reference")))


def test_a_killed_worker_is_replaced_and_no_batch_changes(
    tmp_path: Path, uninterrupted: list[str], caplog: pytest.LogCaptureFixture
) -> None:
    killed: list[int] = []

    def kill_one(run: Run) -> None:
        if run.step + 1 in (4, 13):  # mid-epoch 0 and mid-epoch 1
            victim = min(workers_of_this_process())
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)
            while alive(victim):
                time.sleep(0.001)

    assert batches(make_run(tmp_path), kill_one) == uninterrupted
    assert len(killed) == 2
    restarts = [r for r in caplog.records if "restarting the data loader" in r.getMessage()]
    assert len(restarts) == 2 and "killed by SIGKILL" in restarts[0].getMessage()


def test_notice_signals_leave_the_workers_running_and_still_exit_75(tmp_path: Path) -> None:
    watcher = Watcher(local=[SignalDetector(("TERM", "INT"), grace_s=30.0)])
    run = make_run(tmp_path, notices=watcher)
    assert set(watched_signals()) >= {signal.SIGTERM, signal.SIGINT}
    seen: list[int] = []

    def signal_workers_then_self(run: Run) -> None:
        if run.step + 1 == 5:
            workers = workers_of_this_process()
            for pid in workers:  # what a group signal, sent by someone else, does to them
                kill_from_another_process(pid, signal.SIGTERM)
                kill_from_another_process(pid, signal.SIGINT)
            time.sleep(0.2)
            seen.extend(pid for pid in workers if alive(pid))
            assert len(seen) == 2, "a worker died of a notice signal"
            os.kill(os.getpid(), signal.SIGTERM)  # and the main process's share

    with pytest.raises(SystemExit) as exited:
        batches(run, signal_workers_then_self)
    assert exited.value.code == 75
    assert [c.step for c in list_checkpoints(tmp_path) if c.valid] == [5]
    assert signal.SIGTERM not in watched_signals()  # the detector closed with the run


def test_a_worker_that_keeps_dying_is_an_error(tmp_path: Path) -> None:
    def die(worker_id: int) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    loader = DataLoader(
        NoisyDataset(), batch_size=8, shuffle=True, num_workers=1, worker_init_fn=die
    )
    run = Run(
        tmp_path, state={"model": torch.nn.Linear(8, 3)}, loader=loader, steps=4, notices=None
    )
    with pytest.raises(DataLoaderError, match=r"killed by SIGKILL") as raised:
        batches(run)
    assert "num_workers=0" in str(raised.value)
    run.close()


def test_a_forked_child_neither_keeps_nor_weakens_the_lock(tmp_path: Path) -> None:
    run = Run(tmp_path, state={"model": torch.nn.Linear(2, 1)}, notices=None)
    verdict_r, verdict_w = os.pipe()
    go_on_r, go_on_w = os.pipe()
    child = os.fork()
    if child == 0:  # the child: the lock still excludes it, and dropping its copies unlocks nothing
        try:
            fd = os.open(tmp_path / ".lock", os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                os.write(verdict_w, b"taken")
            except BlockingIOError:
                os.write(verdict_w, b"refused")
            os.close(fd)
            os.read(go_on_r, 1)  # stay alive until the parent has tried again
        finally:
            os._exit(0)
    try:
        assert os.read(verdict_r, 16) == b"refused", "the child could take the parent's lock"
        run.close()  # while the forked child is alive: it must not keep the directory locked
        Run(tmp_path, state={"model": torch.nn.Linear(2, 1)}, notices=None).close()
    finally:
        os.write(go_on_w, b"x")
        os.waitpid(child, 0)


PERSISTENT = """
import sys, time, torch
from torch.utils.data import DataLoader, TensorDataset
from spotwise import CheckpointConfig, Run
data = TensorDataset(torch.randn(64, 4))
loader = DataLoader(data, batch_size=4, shuffle=True, num_workers=2, persistent_workers=True)
run = Run(sys.argv[1], state={"model": torch.nn.Linear(4, 1)}, loader=loader, steps=10**6,
          checkpoint=CheckpointConfig(every=None))
for step, _batch in enumerate(run):
    if step == 3:
        print("ready", flush=True)
    time.sleep(0.01)
"""


def test_persistent_workers_let_the_process_exit_after_a_group_sigterm(tmp_path: Path) -> None:
    """Their iterator is still alive at interpreter exit, where multiprocessing terminate()s
    and joins the workers: they must still end on the training process's own SIGTERM."""
    proc = subprocess.Popen(
        [sys.executable, "-c", PERSISTENT, str(tmp_path / "run")],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
        env={**os.environ, "SPOTWISE_PLATFORM": "none"},
    )  # fmt: skip
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        os.killpg(proc.pid, signal.SIGTERM)  # the whole group
        assert proc.wait(timeout=60) == 75
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.stdout.close()
    assert [c.step for c in list_checkpoints(tmp_path / "run") if c.valid]


ORPHANED = """
import os, sys, time, torch
from pathlib import Path
from torch.utils.data import DataLoader, TensorDataset
from spotwise import CheckpointConfig, Run

def init(worker_id):  # the user's own init: the training process dies while it runs
    parent = os.getppid()
    Path(sys.argv[2] + ".tmp").write_text(str(os.getpid()))
    os.replace(sys.argv[2] + ".tmp", sys.argv[2])
    while os.getppid() == parent:
        time.sleep(0.01)

loader = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4, num_workers=1,
                    worker_init_fn=init)
run = Run(sys.argv[1], state={"model": torch.nn.Linear(4, 1)}, loader=loader, steps=10,
          checkpoint=CheckpointConfig(every=None))
for _batch in run:
    pass
"""


def test_a_worker_orphaned_before_torchs_watchdog_starts_ends_and_frees_the_output(
    tmp_path: Path,
) -> None:
    """torch's watchdog starts after the worker's init: a training process SIGKILLed before
    then (the OOM killer, a rank killed while its workers start) must not leave a worker that
    waits forever and holds the job's stdout, so that its launcher (torchrun, a SLURM step)
    never sees the end of the output."""
    pid_file = tmp_path / "worker.pid"
    proc = subprocess.Popen(
        [sys.executable, "-c", ORPHANED, str(tmp_path / "run"), str(pid_file)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "SPOTWISE_PLATFORM": "none"},
    )  # fmt: skip
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
            time.sleep(0.01)
        worker = int(pid_file.read_text())
        proc.kill()  # the training process alone, while the worker's init runs
        out, _ = proc.communicate(timeout=30)  # the end of its output: no worker holds it
        assert proc.returncode == -signal.SIGKILL, out
        deadline = time.monotonic() + 30
        while alive(worker):
            assert time.monotonic() < deadline, f"worker {worker} outlived its training process"
            time.sleep(0.05)
    finally:
        if worker is not None and alive(worker):
            os.kill(worker, signal.SIGKILL)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
