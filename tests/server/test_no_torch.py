"""The server never imports torch: checked in a fresh interpreter that loads the CLI and the
server, submits a sim job and serves the API."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = """
import asyncio, json, sys

import spotwise.cli.main  # every command registered, as `spotwise server` starts
from spotwise.control.store import Store
from spotwise.server.app import create_app
from spotwise.server.driver import Driver
from spotwise.server.principal import Principal
from spotwise.server.serve import serve

store = Store()
app = create_app(store, Driver(store), authenticate=lambda request: Principal("ada", "admin"))


async def call(method, path, body=b""):
    sent = []
    scope = {"type": "http", "method": method, "path": path, "raw_path": path.encode(),
             "query_string": b"", "headers": [(b"host", b"127.0.0.1")], "root_path": "",
             "scheme": "http", "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1)}
    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}
    async def send(message):
        sent.append(message)
    await app(scope, receive, send)
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


async def main():
    status, body = await call("POST", "/api/v1/jobs", sys.argv[1].encode())
    job = json.loads(body)["id"]
    listed, _ = await call("GET", "/api/v1/jobs")
    shown, _ = await call("GET", f"/api/v1/jobs/{job}")
    return [status, listed, shown]

print(json.dumps({"status": asyncio.run(main()), "torch": "torch" in sys.modules}))
"""


def test_the_server_never_imports_torch(tmp_path: Path):
    job = textwrap.dedent(
        f"""
        name: sim
        command: python -c pass
        workdir: {tmp_path}
        market: spot
        provider: {{name: sim, zones: [us-east-1a], time_compression: 10}}
        resources: {{instance_type: p3.2xlarge}}
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, job], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"status": [201, 200, 200], "torch": False}
