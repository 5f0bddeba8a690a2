"""Background saves under torch.distributed: a torchrun job (two gloo ranks) SIGKILLed while
its ranks write a checkpoint in the background leaves only whole checkpoints, and its restart
ends exactly like a job that was never interrupted; in this process (one gloo rank), a save is
committed at a later step boundary and a write that fails raises SaveError there, leaving the
previous checkpoint the newest."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from spotwise import CheckpointConfig, Run
from spotwise.checkpoint.format import MANIFEST, step_dir_name
from spotwise.checkpoint.write import TMP_PREFIX
from spotwise.errors import SaveError
from spotwise.runtime.commit import list_checkpoints, load_checkpoint

from .conftest import (
    HASH,
    RESUMED,
    finish,
    launch,
    signal_job,
    wait_for,
    wait_stopped,
    workers,
)

CHILD = Path(__file__).with_name("_async_child.py")
STEPS, EVERY = 50, 10
FIRST_SEEN = re.compile(r"first-save-seen-in-step: (\d+)")

pytestmark = pytest.mark.e2e


def job(run_dir: Path, *args: str) -> subprocess.Popen[str]:
    return launch(2, CHILD, str(run_dir), "--steps", str(STEPS), "--save-every", str(EVERY), *args)


def _step_of(tmp: Path) -> int:
    return int(tmp.name[len(TMP_PREFIX) :].split("-")[0])


def _files(directory: Path) -> set[str] | None:
    try:
        return set(os.listdir(directory))
    except FileNotFoundError:  # committed (renamed into place) or removed
        return None


def freeze_mid_write(
    proc: subprocess.Popen[str], pids: list[int], run_dir: Path, whole: set[str]
) -> tuple[Path, set[str]]:
    """Stop the job (SIGSTOP to the workers ``pids`` and the agent) as soon as a background
    save's temporary directory holds a file, and return it stopped if it really is in the middle
    of the write: no manifest yet and some of the files of a whole checkpoint (``whole``) not
    created yet. Otherwise (the write had finished by the time the job stopped) let it go on and
    catch a later save. The last save, which the run makes blocking, does not count."""
    looked_at: set[str] = set()
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the job ended before a background write was caught"
        for tmp in run_dir.glob(f"{TMP_PREFIX}*"):
            if tmp.name in looked_at or _step_of(tmp) >= STEPS or not _files(tmp):
                continue
            signal_job(proc, signal.SIGSTOP, pids)
            wait_stopped([*pids, proc.pid])  # a file being created now is there, or never
            present = _files(tmp)
            if present is not None and MANIFEST not in present and present < whole:
                return tmp, present
            looked_at.add(tmp.name)
            signal_job(proc, signal.SIGCONT, pids)
        time.sleep(0.001)
    raise AssertionError("no background write was caught in 90 s")


def test_a_job_killed_during_a_background_write_resumes_exactly(tmp_path: Path) -> None:
    reference = job(tmp_path / "reference")  # uninterrupted, alongside the one killed
    try:
        _kill_mid_write_and_resume(reference, tmp_path / "run")
    finally:
        if reference.poll() is None:
            with contextlib.suppress(OSError):  # it may end meanwhile
                signal_job(reference, signal.SIGKILL, workers(reference))
            reference.communicate()


def _kill_mid_write_and_resume(reference: subprocess.Popen[str], run_dir: Path) -> None:
    victim = job(run_dir, "--step-sleep", "0.02")
    pids: list[int] = []
    try:
        wait_for(run_dir / step_dir_name(EVERY), victim)
        pids = workers(victim)
        assert len(pids) == 2
        whole = set(load_checkpoint(run_dir / step_dir_name(EVERY)).manifest.files)
        tmp, present = freeze_mid_write(victim, pids, run_dir, whole)
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have ended on its own
            signal_job(victim, signal.SIGKILL, pids)  # the whole job at once, stopped or not
        finish(victim)
    killed_at = _step_of(tmp)
    left = list_checkpoints(run_dir, deep=True)
    assert left and all(c.valid for c in left), [c.as_dict() for c in left]
    newest = left[-1].step
    assert newest < killed_at, (newest, killed_at, present)
    assert _files(tmp) == present  # the half-written save was never committed

    rc, out = finish(reference)
    assert rc == 0, out[-3000:]
    (expected,) = HASH.findall(out)
    # training went on while the first save was written: a blocking save would have committed
    # it before the body of the step right after it
    (seen,) = FIRST_SEEN.findall(out)
    assert int(seen) > EVERY + 1, out[-3000:]

    rc, out = finish(job(run_dir))
    assert rc == 0, out[-3000:]
    assert [int(s) for s in RESUMED.findall(out)] == [newest, newest]
    assert HASH.findall(out) == [expected]
    assert not list(run_dir.glob(f"{TMP_PREFIX}*"))  # rank 0 removed the half-written save
    assert all(c.valid for c in list_checkpoints(run_dir, deep=True))


def test_a_background_save_commits_at_a_later_boundary_and_a_failed_write_raises(
    tmp_path: Path,
    one_rank: None,
    file_size_limit: Callable[[int], contextlib.AbstractContextManager[None]],
) -> None:
    model = torch.nn.Linear(512, 512)  # 1 MiB of weights
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    run = Run(tmp_path, state={"model": model, "optimizer": optimizer}, steps=40,
              checkpoint=CheckpointConfig(every=4), notices=None)  # fmt: skip
    seen: dict[int, int] = {}  # checkpoint step -> the run.step of the body that first saw it
    limited = False
    with contextlib.ExitStack() as limits, pytest.raises(SaveError) as failed:
        for _ in run:
            optimizer.zero_grad()
            model(torch.randn(4, 512)).sum().backward()
            optimizer.step()
            for info in list_checkpoints(tmp_path):
                seen.setdefault(info.step, run.step)
            if seen and not limited:  # from the first commit on, no 1 MiB tensor file fits
                limits.enter_context(file_size_limit(64 << 10))
                limited = True
    # staged at the boundary of step 4, written while steps 5 and 6 ran: the write phase ends
    # at a boundary only once every rank reported done one boundary earlier, so not before 6
    assert seen[4] >= 6, seen
    # the save in flight when the limit came may still have finished; the next one cannot
    valid = [c.step for c in list_checkpoints(tmp_path, deep=True) if c.valid]
    assert valid in ([4], [4, 8]), valid
    message = failed.value.message  # raised at a later boundary, on every rank together
    assert message.startswith(f"could not save step {valid[-1] + 4}: rank 0: OSError:"), message
    assert "File too large" in message
    assert not list(tmp_path.glob(f"{TMP_PREFIX}*"))  # the failed save's directory is gone
