"""``launch --json`` and ``cancel --json`` print the same documents through a server as in the
embedded mode (``jobs --json`` and ``status --json``: tests/server/test_client.py)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from ._remote import remote_server
from .conftest import wait_until
from .test_client import TERMINAL, _cli, _client_env, _job_file, _token_for

# what differs between two jobs of one job file, or one job seen a moment apart
VARYING = ("id", "created_at", "updated_at", "log", "controller_alive")


@pytest.fixture()
def real_server(tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    with remote_server(tmp_path) as served:
        yield served


def _same(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in VARYING}


def test_launch_and_cancel_json_through_a_server_and_embedded(real_server, tmp_path: Path):
    url, _, host_env = real_server
    alice = _client_env(tmp_path, url, _token_for("alice", "user", host_env), "alice")
    laptop = {k: v for k, v in os.environ.items() if k not in ("SPOTWISE_SERVER", "SPOTWISE_TOKEN")}
    laptop["SPOTWISE_HOME"] = str(tmp_path / "laptop-home")
    job = _job_file(tmp_path, 0)

    launched = _cli("launch", str(job), "--json", env=alice)
    assert launched.returncode == 0, launched.stderr
    through = json.loads(launched.stdout)  # the whole output: one document
    embedded = json.loads(_cli("launch", str(job), "--detach", "--json", env=laptop).stdout)
    assert set(through) == set(embedded)
    assert _same(through) == _same(embedded)  # as accepted: PENDING, no attempt yet
    assert through["state"] == "PENDING" and through["attempts"] == []

    def ended(env: dict[str, str], job_id: str) -> bool:
        return json.loads(_cli("status", job_id, "--json", env=env).stdout)["state"] in TERMINAL

    wait_until(lambda: ended(alice, through["id"]), timeout_s=300)
    wait_until(lambda: ended(laptop, embedded["id"]), timeout_s=300)  # (its controller is done)
    # cancel of the same (ended) job through the server and on the server's own host
    remote = json.loads(_cli("cancel", through["id"], "--json", env=alice).stdout)
    here = json.loads(_cli("cancel", through["id"], "--json", env=host_env).stdout)
    remote.pop("controller_alive"), here.pop("controller_alive")
    assert remote == here and remote["state"] == "SUCCEEDED"
