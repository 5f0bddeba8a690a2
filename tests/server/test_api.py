"""The JSON API of a real server process: submit, list, status, logs, cancel, resume, metrics,
and who may do what (fixed tokens: tests/server/_serve.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from spotwise.control.store import Store
from spotwise.server.app import create_app
from spotwise.server.driver import Driver
from spotwise.server.openapi import openapi_document

from .conftest import Server, wait_until

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]
STANDIN = """
import sys, time
print("run will sleep", sys.argv[1], flush=True)
time.sleep(float(sys.argv[1]))
print("final-weights-sha256: standin", flush=True)
"""


def _job(name: str, sleep_s: float) -> bytes:
    return textwrap.dedent(
        f"""
        name: {name}
        command: python standin.py {sleep_s}
        provider: local
        restart_backoff: 0
        """
    ).encode()


def _state(server: Server, job_id: str) -> str:
    return server.call("GET", f"/api/v1/jobs/{job_id}").json()["state"]


def _submit(server: Server, workdir: Path, body: bytes, token: str = "admin-token"):
    return server.call("POST", f"/api/v1/jobs?base_dir={workdir}", token, body)


def test_jobs_through_the_api(server, tmp_path: Path):
    (tmp_path / "standin.py").write_text(STANDIN)
    s: Server = server()
    assert s.call("GET", "/healthz", token=None).status == 200

    # who may do what
    for token in (None, "wrong"):
        denied = s.call("GET", "/api/v1/jobs", token)
        assert denied.status == 401
        assert (
            "spotwise login" in denied.json()["hint"] and "SPOTWISE_TOKEN" in denied.json()["hint"]
        )
    assert _submit(s, tmp_path, _job("v", 1), "viewer-token").status == 403

    # a bad job file: refused as `spotwise launch` refuses it
    bad = tmp_path / "bad.yaml"
    bad.write_bytes(_job("b", 1).replace(b"command:", b"comand:"))
    refused = _submit(s, tmp_path, bad.read_bytes())
    launch = subprocess.run([*SPOTWISE, "launch", str(bad)], capture_output=True, text=True)
    assert refused.status == 422 and launch.returncode == 2
    problem = refused.json()["error"].split("\n", 1)[1]
    assert "comand: unknown field" in problem and problem in launch.stderr
    assert _submit(s, tmp_path, b"name: [unclosed").status == 400
    assert _submit(s, tmp_path, b"\xff\xfe\x00").status == 400

    # a job that runs to the end
    done = _submit(s, tmp_path, _job("quick", 0.2))
    assert done.status == 201
    quick = done.json()["id"]

    def ended() -> bool:  # and let go by the server (its cleanup done)
        status = s.call("GET", f"/api/v1/jobs/{quick}").json()
        return status["state"] == "SUCCEEDED" and not status["controller_alive"]

    wait_until(ended)
    status = s.call("GET", f"/api/v1/jobs/{quick}").json()
    cli = subprocess.run([*SPOTWISE, "status", quick, "--json"], capture_output=True, text=True)
    assert status == json.loads(cli.stdout)  # the same document as `spotwise status --json`
    logs = s.call("GET", f"/api/v1/jobs/{quick}/logs?follow=1").body.decode()
    assert "final-weights-sha256: standin" in logs
    assert s.call("GET", f"/api/v1/jobs/{quick}/logs?offset=5").body.decode() == logs[5:]
    metrics = s.call("GET", f"/api/v1/jobs/{quick}/metrics")
    assert metrics.status == 200 and {"metrics", "ledger", "checkpoints"} <= set(metrics.json())

    # a long job: followed, refused to a viewer, cancelled by an admin
    slow = _submit(s, tmp_path, _job("slow", 120)).json()["id"]
    wait_until(lambda: _state(s, slow) == "RUNNING")
    followed: list[bytes] = []
    follower = threading.Thread(
        target=lambda: followed.append(s.call("GET", f"/api/v1/jobs/{slow}/logs?follow=1").body)
    )
    follower.start()
    assert s.call("GET", f"/api/v1/jobs/{slow}", "viewer-token").status == 200
    assert s.call("POST", f"/api/v1/jobs/{slow}/cancel", "viewer-token").status == 403
    # a user reads and changes only their own jobs: this one is not theirs
    assert s.call("GET", f"/api/v1/jobs/{slow}", "user-token").status == 404
    assert s.call("POST", f"/api/v1/jobs/{slow}/cancel", "user-token").status == 404
    assert s.call("GET", "/api/v1/jobs", "user-token").json() == []
    assert s.call("GET", f"/api/v1/jobs/{slow[:-1]}").status == 404  # ids exactly, no prefixes
    assert s.call("POST", f"/api/v1/jobs/{slow}/resume").status == 202
    assert _state(s, slow) == "RUNNING"
    assert s.call("POST", f"/api/v1/jobs/{slow}/cancel").status == 202
    wait_until(lambda: _state(s, slow) == "CANCELLED")
    follower.join(30)
    assert followed and b"run will sleep 120" in followed[0]

    # the dashboard shows every job: to admins and viewers, never without a token
    assert s.call("GET", "/", token=None).status == 401
    assert s.call("GET", "/", "user-token").status == 403
    page = s.call("GET", f"/job/{quick}", "viewer-token")
    assert page.status == 200 and quick.encode() in page.body
    assert s.call("POST", f"/api/jobs/{slow}/cancel", "viewer-token").status == 403

    listed = {j["id"]: j["state"] for j in s.call("GET", "/api/v1/jobs", "viewer-token").json()}
    assert listed == {quick: "SUCCEEDED", slow: "CANCELLED"}
    # the server drove them without ever importing torch
    maps = Path(f"/proc/{s.proc.pid}/maps").read_text()
    assert "libtorch" not in maps


def test_openapi_lists_every_route(tmp_path: Path):
    store = Store()
    app = create_app(store, Driver(store), authenticate=lambda request: None)
    documented = {
        (path, method.upper())
        for path, ops in openapi_document()["paths"].items()
        for method in ops
    }
    served = {
        (route.path, method)
        for route in app.routes
        for method in getattr(route, "methods", None) or ()
        if method != "HEAD"
    }
    assert served and served == documented
