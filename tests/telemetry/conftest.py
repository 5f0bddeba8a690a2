"""Telemetry test fixtures: a fake NVML library built with gcc, a finished demo job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def fake_nvml_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding a gcc-built ``libnvidia-ml.so.1`` (put it on LD_LIBRARY_PATH)."""
    out = tmp_path_factory.mktemp("fake-nvml")
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O1",
            "-o",
            str(out / "libnvidia-ml.so.1"),
            str(HERE / "fake_nvml.c"),
        ],
        check=True,
    )
    return out


ROOT = HERE.parents[1]
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def demo_job_yaml(
    tmp: Path, *, name: str = "digits", steps: int = 250, step_sleep: float = 0.1
) -> Path:
    """The README's digits job on the simulated spot market, shortened: ~25 s of training that
    the trace interrupts at least once."""
    text = (ROOT / "examples" / "digits" / "job.yaml").read_text()
    text = text.replace("name: digits", f"name: {name}")
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
