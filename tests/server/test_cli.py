"""``spotwise server`` as a user starts it: where it may listen, and a clean start and stop."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from .conftest import URL, Server

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def _spotwise(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPOTWISE, *args], capture_output=True, text=True, timeout=60)


def test_another_address_than_loopback_needs_tls_or_a_proxy(tmp_path: Path):
    refused = _spotwise("server", "--host", "0.0.0.0")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--host 0.0.0.0" in refused.stderr
    assert "--tls-cert" in refused.stderr and "--behind-proxy" in refused.stderr
    half = _spotwise("server", "--host", "10.1.2.3", "--tls-cert", str(tmp_path / "c.pem"))
    assert half.returncode == 2 and "--tls-cert and --tls-key go together" in half.stderr
    assert "adopts every job" in _spotwise("server", "--help").stdout


def test_serves_until_sigterm(tmp_path: Path):
    proc = subprocess.Popen(
        [*SPOTWISE, "server", "--port", "0", "--home", str(tmp_path / "home")],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = URL.search(line)
    assert found, line
    assert str(tmp_path / "home" / "spotwise.db") in line  # --home holds the store
    server = Server(proc, found.group(1))
    assert server.call("GET", "/healthz", token=None).json() == {"ok": True, "driving": 0}
    assert server.call("GET", "/api/v1/jobs", token=None).status == 401
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM  # stopped, then ended by the signal (uvicorn's way)
