"""Telemetry test fixtures: a fake NVML library built with gcc, a finished demo job, a job whose
run diverged (NaN and infinite losses) and whose data is full of rich markup."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotwise.control.spec import JobSpec
from spotwise.control.store import JobState, Store
from spotwise.telemetry.events import EVENTS_FILE, EventLog
from spotwise.telemetry.jobview import run_dir

from .tools import build_fake_nvml

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a gcc-built ``libnvidia-ml.so.1`` (put it on LD_LIBRARY_PATH)."""
    return build_fake_nvml(tmp_path_factory.mktemp("fake-nvml"))


ROOT = HERE.parents[1]
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def demo_job_yaml(
    tmp: Path, *, name: str = "digits", steps: int = 150, step_sleep: float = 0.1
) -> Path:
    """The README's digits job on the simulated spot market, shortened: ~15 s of training, from
    a point of the trace where the first zone's spot capacity goes 16 s after launch (notice at
    8 s) and the next zone's lasts minutes: one preemption, then the rest of the work."""
    text = (ROOT / "examples" / "digits" / "job.yaml").read_text()
    text = text.replace("name: digits", f"name: {name}")
    text = text.replace("start_hour: 368 ", "start_hour: 399.5 ")
    # spot in the listed zones' order (no policy): the first zone's loss is the preemption
    text = text.replace("market: auto ", "market: spot ")
    text = text.replace(
        "--steps 400 --save-every 10 --step-sleep 0.1",
        f"--steps {steps} --save-every 10 --step-sleep {step_sleep}",
    )
    text = text.replace("workdir: .", f"workdir: {ROOT / 'examples' / 'digits'}")
    path = tmp / f"{name}.yaml"
    path.write_text(text)
    return path


def cli(*args: str, home: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "SPOTWISE_HOME": str(home), "SPOTWISE_PLATFORM": "none"}
    return subprocess.run(
        [*SPOTWISE, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A SPOTWISE_HOME holding one finished (preempted, then succeeded) digits job."""
    home = tmp_path_factory.mktemp("demo-home")
    done = cli("launch", str(demo_job_yaml(home)), home=home, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    [job] = json.loads(cli("jobs", "--json", home=home).stdout)
    return home, job["id"]


def add_attempt(
    store,
    job_id: str,
    *,
    start: float,
    running: float | None = None,
    end: float | None = None,
    market: str = "spot",
    zone: str = "a",
    usd: float = 1.0,
    ondemand: float = 3.0,
    scale: float = 600.0,
    reason: str | None = None,
    exit_code: int | None = None,
) -> None:
    """Record an attempt through the store's own API, ended when ``end`` is given."""
    a = store.open_attempt(
        job_id,
        provider="sim",
        market=market,
        zone=zone,
        usd_per_hour=usd,
        ondemand_usd_per_hour=ondemand,
        time_scale=scale,
        now=start,
    )
    if end is not None:
        store.update_attempt(
            job_id,
            a.n,
            state="ended",
            running_at=running,
            ended_at=end,
            reason=reason,
            exit_code=exit_code,
        )


# what a user may write or a run may log, none of it rich markup or JSON that a browser parses
MARKUP = r"[/] [bold red]x[/bold red] [link=https://example.invalid]y[/link] :smile: $\frac{$"
DIVERGED_LOSS = [0.9, 0.5, math.nan, math.inf, -math.inf, 1e308, 0.25]


def strict_json(text: str) -> object:
    """``json.loads`` that refuses ``NaN``/``Infinity`` as every other JSON parser does."""

    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture()
def diverged_home() -> tuple[Path, str]:
    """A SPOTWISE_HOME with one failed job whose run logged a loss that went NaN, +-Infinity
    and 1e308 (through the runtime's own event log, as ``run.log`` records it), and whose
    command, zone, message and other metric's name hold rich markup and mathtext."""
    home = Path(os.environ["SPOTWISE_HOME"])  # the test's own (job directories follow it)
    store = Store(home)
    spec = {"name": "diverged", "command": ["python", "train.py", MARKUP], "provider": "local"}
    now = time.time()
    job = store.create_job("diverged", spec, None, now=now - 100)
    add_attempt(store, job.id, start=now - 99, running=now - 98, end=now - 1, zone=MARKUP,
                reason="failed", exit_code=1)  # fmt: skip
    directory = run_dir(job, JobSpec.model_validate(spec))
    assert directory is not None
    events = EventLog(directory / EVENTS_FILE)
    for step, loss in enumerate(DIVERGED_LOSS):
        events.emit("metrics", step=10 * step, values={"loss": loss, MARKUP: 0.1})
    store.update_job(job.id, state=JobState.FAILED, message=f"training diverged {MARKUP}")
    store.close()
    return home, job.id
