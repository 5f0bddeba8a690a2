"""Helpers for controller tests: stand-in training scripts and jobs run to the end in-process."""

from __future__ import annotations

import contextlib
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from spotwise.control.controller import Controller
from spotwise.control.spec import JobSpec, parse_spec
from spotwise.control.store import Store
from spotwise.control.submission import submit
from spotwise.control.summary import job_summary

# A stand-in for a training script: counts its runs in a file, sleeps, exits with the code
# chosen for that run, and exits 75 on SIGTERM (as the runtime does after its emergency save).
STANDIN = """
import os, signal, sys, time
runs = int(open("runs").read()) if os.path.exists("runs") else 0
open("runs", "w").write(str(runs + 1))
codes = [int(c) for c in sys.argv[1].split(",")]
code = codes[min(runs, len(codes) - 1)]
signal.signal(signal.SIGTERM, lambda *_: (print("saved on notice", flush=True), sys.exit(75)))
print(f"run {runs} will exit {code}", flush=True)
deadline = time.time() + float(sys.argv[2] if len(sys.argv) > 2 else 0.2)
while time.time() < deadline:
    time.sleep(0.02)
print("final-weights-sha256: standin", flush=True)
sys.exit(code)
"""


@pytest.fixture()
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "standin.py").write_text(textwrap.dedent(STANDIN))
    return tmp_path


def make_spec(workdir: Path, **fields: Any) -> JobSpec:
    doc: dict[str, Any] = {
        "name": "t",
        "command": "python standin.py 0",
        "provider": "local",
        "restart_backoff": 0,
    }
    doc.update(fields)
    return parse_spec(doc, base_dir=workdir)


def run_to_end(spec: JobSpec) -> dict[str, Any]:
    store = Store()
    job = submit(store, spec)
    Controller(store, job.id).run()
    return job_summary(store, store.job(job.id))


def runs(workdir: Path) -> int:
    return int((workdir / "runs").read_text())


def wait_until(pred: Callable[[], object], timeout_s: float = 180.0) -> None:
    deadline = time.time() + timeout_s
    while not pred():
        assert time.time() < deadline, "timed out waiting"
        time.sleep(0.2)


@contextlib.contextmanager
def controller_thread(spec: JobSpec, join_s: float) -> Iterator[SimpleNamespace]:
    """Submit ``spec`` and run its controller in a thread (with its own store connection) while
    the body acts on the job through ``.store``, ``.job`` and ``.text()`` (its log so far). On
    leaving, wait up to ``join_s`` for the job to end; one still running then is cancelled."""
    store = Store()
    job = submit(store, spec)
    log = store.job(job.id).log_path
    thread = threading.Thread(target=lambda: Controller(Store(), job.id).run())
    thread.start()
    try:
        yield SimpleNamespace(
            store=store,
            job=job,
            text=lambda: log.read_text(errors="replace") if log.exists() else "",
        )
        thread.join(join_s)
    finally:
        if thread.is_alive():
            Store().request_cancel(job.id)
            thread.join(60)


@pytest.fixture()
def kit() -> SimpleNamespace:
    """``kit.spec(workdir, **fields)``, ``kit.run(spec)``, ``kit.runs(workdir)``,
    ``kit.wait(pred, timeout_s)``, ``with kit.controller(spec, join_s) as running: ...``."""
    return SimpleNamespace(
        spec=make_spec, run=run_to_end, runs=runs, wait=wait_until, controller=controller_thread
    )
