"""The real ``spotwise server`` (its own users and tokens) for the client tests, run from a
folder and a HOME of its own, as another machine's server would be."""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .test_client import SPOTWISE


@contextmanager
def remote_server(tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    """Its URL, the first-start admin token and its host's environment (its SPOTWISE_HOME and
    HOME, no server configured)."""
    home, cwd = tmp_path / "server-home", tmp_path / "server-cwd"
    cwd.mkdir()
    env = {**os.environ, "SPOTWISE_HOME": str(home), "HOME": str(cwd), "PYTHONUNBUFFERED": "1"}
    for name in ("SPOTWISE_SERVER", "SPOTWISE_TOKEN"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [*SPOTWISE, "server", "--port", "0"], env=env, cwd=cwd, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        url = re.search(r"spotwise server on (http://\S+?)/ ", proc.stdout.readline())
        assert url
        proc.stdout.readline()
        yield url.group(1), proc.stdout.readline().strip(), env
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
