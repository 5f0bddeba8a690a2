"""Test-wide settings: never probe real cloud metadata; keep state in temp dirs."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

# Platform auto-detection probes the link-local metadata address; it must never run in tests.
os.environ["SPOTWISE_PLATFORM"] = "none"
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
os.environ.setdefault("no_proxy", "127.0.0.1,localhost")

import pytest

ROOT = Path(__file__).resolve().parents[1]
_STARTED: dict[str, bool] = {}
_SKIPPED: dict[str, int] = {}  # reason -> tests skipped for it, summed up in one line at the end


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for reason, n in _SKIPPED.items():
        terminalreporter.write_line(f"spotwise: {n} tests skipped, {reason}")


def require_service(name: str, probe: Callable[[], bool], script: str) -> None:
    """Make sure a real service the tests need is up: start it with the repository's own script
    when it is down and we are root (what ``.ci/run`` does, so ``make test`` works on a fresh
    machine too); otherwise fail under CI (a missing service must never pass as skipped) or skip
    with one line saying how to run these tests."""
    if probe():
        return
    path = ROOT / script
    if name not in _STARTED and os.geteuid() == 0 and path.exists():
        out = subprocess.run([str(path)], capture_output=True, text=True, timeout=900)
        _STARTED[name] = out.returncode == 0 and probe()
        if not _STARTED[name]:
            print(f"{script} could not start {name}:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    if _STARTED.get(name):
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{name} is not reachable in CI: {script} must start it")
    reason = f"{name} is not reachable: `sudo {script}` installs and starts it"
    _SKIPPED[reason] = _SKIPPED.get(reason, 0) + 1
    pytest.skip(reason)


def _slurm_up() -> bool:
    if shutil.which("scontrol") is None:
        return False
    return subprocess.run(["scontrol", "ping"], capture_output=True, timeout=30).returncode == 0


@pytest.fixture(scope="session")
def slurm() -> None:
    """A real slurmctld + slurmd on localhost (scripts/slurm-up.sh)."""
    require_service("slurmctld", _slurm_up, "scripts/slurm-up.sh")


@pytest.fixture(autouse=True)
def _spotwise_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch):
    """Each test gets its own SPOTWISE_HOME so jobs and databases never leak between tests."""
    monkeypatch.setenv("SPOTWISE_HOME", str(tmp_path_factory.mktemp("spotwise-home")))
    monkeypatch.setenv("SPOTWISE_PLATFORM", "none")


@pytest.fixture(scope="session")
def moto_server():
    """A real S3/EC2-speaking HTTP server on loopback (moto in server mode, as s3fs tests use).

    Yields the endpoint URL. Clients reach it with the real boto3 and fake credentials; nothing
    leaves 127.0.0.1. Tests that need a clean slate create uniquely named buckets.
    """
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture()
def aws_env(moto_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """Point the AWS SDK at the loopback moto server with fake credentials."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_server)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return moto_server
