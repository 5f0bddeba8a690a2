"""The CLI as a client of a real ``spotwise server`` (its own users and tokens, its first-start
admin token): the same commands and ``--json`` documents as the embedded mode, a launch that
returns at once and a job that finishes without its client, login, and who sees what."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import wait_until

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]
STANDIN = """
import sys, time
print("run will sleep", sys.argv[1], flush=True)
time.sleep(float(sys.argv[1]))
print("final-weights-sha256: standin", flush=True)
"""
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def _cli(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*SPOTWISE, *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture()
def served(tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    """The real ``spotwise server`` on a free port: its URL, its first-start admin token (as
    printed), and the environment of its host (its SPOTWISE_HOME, no server configured)."""
    home = tmp_path / "server-home"
    host_env = {**os.environ, "SPOTWISE_HOME": str(home), "PYTHONUNBUFFERED": "1"}
    for name in ("SPOTWISE_SERVER", "SPOTWISE_TOKEN"):
        host_env.pop(name, None)
    proc = subprocess.Popen(
        [*SPOTWISE, "server", "--port", "0"], env=host_env, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        first = proc.stdout.readline()
        url = re.search(r"spotwise server on (http://\S+?)/ ", first)
        assert url, first
        assert "admin token" in proc.stdout.readline()
        token = proc.stdout.readline().strip()
        assert token.startswith("spw_")
        written = home / "admin-token"
        assert written.read_text().strip() == token
        assert stat.S_IMODE(written.stat().st_mode) == 0o600
        yield url.group(1), token, host_env
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _client_env(tmp_path: Path, url: str, token: str, who: str) -> dict[str, str]:
    """A user's own machine: another SPOTWISE_HOME, the server named by the environment."""
    return {
        **os.environ,
        "SPOTWISE_HOME": str(tmp_path / f"{who}-home"),
        "SPOTWISE_SERVER": url,
        "SPOTWISE_TOKEN": token,
    }


def _token_for(name: str, role: str, host_env: dict[str, str]) -> str:
    assert _cli("users", "add", name, "--role", role, env=host_env).returncode == 0
    made = _cli("tokens", "create", name, env=host_env)
    assert made.returncode == 0, made.stderr
    return made.stdout.strip()


def _job_file(tmp_path: Path, sleep_s: float) -> Path:
    work = tmp_path / "work"
    work.mkdir(exist_ok=True)
    (work / "standin.py").write_text(STANDIN)
    job = work / "job.yaml"
    job.write_text(
        textwrap.dedent(
            f"""
            name: remote
            command: python standin.py {sleep_s}
            provider: local
            restart_backoff: 0
            """
        )
    )
    return job


def test_the_job_commands_through_a_server(served, tmp_path: Path) -> None:
    url, admin, host_env = served
    alice = _client_env(tmp_path, url, _token_for("alice", "user", host_env), "alice")
    bob = _client_env(tmp_path, url, _token_for("bob", "user", host_env), "bob")
    viewer = _client_env(tmp_path, url, _token_for("vera", "viewer", host_env), "vera")

    # launch returns once the server accepted the job, the id as its last line; the client
    # process is gone from then on, and the job runs to its end all the same
    launched = _cli("launch", str(_job_file(tmp_path, 2)), env=alice)
    assert launched.returncode == 0, launched.stderr
    job_id = launched.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"remote-[0-9a-f]{6}", job_id)

    # a viewer reads it but may not cancel it; another user does not even see it
    refused = _cli("cancel", job_id, env=viewer)
    assert refused.returncode == 2 and "may not change" in refused.stderr
    assert "Traceback" not in refused.stderr
    hidden = _cli("status", job_id, env=bob)
    assert hidden.returncode == 2 and "no job" in hidden.stderr
    assert json.loads(_cli("jobs", "--json", env=bob).stdout) == []

    followed = _cli("logs", job_id[:9], "-f", env=alice)  # a unique prefix, as embedded
    assert followed.returncode == 0, followed.stderr
    assert "final-weights-sha256: standin" in followed.stdout
    wait_until(
        lambda: json.loads(_cli("status", job_id, "--json", env=alice).stdout)["state"] in TERMINAL
    )

    # the same documents as the embedded mode on the server's own host
    for command in (["status", job_id, "--json"], ["jobs", "--json"]):
        remote = json.loads(_cli(*command, env=alice).stdout)
        here = json.loads(_cli(*command, env=host_env).stdout)
        for doc in remote if isinstance(remote, list) else [remote]:
            doc.pop("controller_alive")  # (the server lets a job go a moment after its end)
        for doc in here if isinstance(here, list) else [here]:
            doc.pop("controller_alive")
        assert remote == here
    assert json.loads(_cli("status", job_id, "--json", env=alice).stdout)["state"] == "SUCCEEDED"
    # the admin sees every job
    admin_env = _client_env(tmp_path, url, admin, "admin")
    assert [j["id"] for j in json.loads(_cli("jobs", "--json", env=admin_env).stdout)] == [job_id]


def test_login_stores_a_checked_token_only_its_owner_reads(served, tmp_path: Path) -> None:
    url, admin, _ = served
    env = {**os.environ, "SPOTWISE_HOME": str(tmp_path / "laptop")}
    for name in ("SPOTWISE_SERVER", "SPOTWISE_TOKEN"):
        env.pop(name, None)
    wrong = _cli("login", url, "--token", "spw_000000000000_nope", env=env)
    assert wrong.returncode == 2 and "refused the token" in wrong.stderr
    assert "spw_000000000000_nope" not in wrong.stderr
    assert not (tmp_path / "laptop" / "login.json").exists()

    ok = _cli("login", url, "--token", admin, env=env)
    assert ok.returncode == 0, ok.stderr
    stored = tmp_path / "laptop" / "login.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert admin not in ok.stdout + ok.stderr
    # later commands use it: the server's (empty) list, not this laptop's store
    launched = _cli("launch", str(_job_file(tmp_path, 0)), env=env)
    assert launched.returncode == 0, launched.stderr
    listed = json.loads(_cli("jobs", "--json", env=env).stdout)
    assert [j["id"] for j in listed] == [launched.stdout.strip().splitlines()[-1]]
    assert not (tmp_path / "laptop" / "spotwise.db").exists()

    assert _cli("logout", env=env).returncode == 0
    assert json.loads(_cli("jobs", "--json", env=env).stdout) == []  # embedded again


def test_a_server_that_does_not_answer_is_one_clear_error(tmp_path: Path) -> None:
    env = _client_env(tmp_path, "http://127.0.0.1:9", "spw_x", "nobody")
    for command in (["jobs"], ["status", "x"], ["logs", "x"], ["cancel", "x"]):
        out = _cli(*command, env=env)
        assert out.returncode == 2
        assert "http://127.0.0.1:9 does not answer" in out.stderr
        assert "Traceback" not in out.stderr and "spw_x" not in out.stderr
