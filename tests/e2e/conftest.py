"""What the e2e tests share: the CLI as a user runs it, and the same training run, never
interrupted, to compare against."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spotwise.control.spec import JobSpec

HASH = re.compile(r"final-weights-sha256: ([0-9a-f]{64})")
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``spotwise ARGS`` in a fresh interpreter, as a user runs it, its output captured."""
    return subprocess.run(
        [*SPOTWISE, *args], capture_output=True, text=True, timeout=timeout, env=env
    )


@pytest.fixture()
def uninterrupted(tmp_path: Path) -> Iterator[Callable[[JobSpec], Callable[[], str]]]:
    """``start(spec)`` runs the job's command locally in the background, with its own run
    directory and no interruption; calling what it returns waits and gives the final hash."""
    started: list[subprocess.Popen[str]] = []

    def start(spec: JobSpec) -> Callable[[], str]:
        run_dir = str(tmp_path / "uninterrupted")
        argv = [a.replace("$SPOTWISE_CHECKPOINT_DIR", run_dir) for a in spec.command[1:]]
        proc = subprocess.Popen(
            [sys.executable, *argv],
            cwd=spec.workdir,
            env={**os.environ, "SPOTWISE_PLATFORM": "none"},
            stdout=subprocess.PIPE,
            text=True,
        )
        started.append(proc)

        def final_hash() -> str:
            out, _ = proc.communicate(timeout=300)
            assert proc.returncode == 0
            return HASH.findall(out)[-1]

        return final_hash

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
