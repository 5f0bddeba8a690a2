"""What the CLI and the server refuse around a server: ``sweep`` and ``infer`` with a server
configured (they run their workers from the CLI's own process), and the dashboard's Host check
(by default only loopback names; ``--allowed-host`` adds a Service's)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from .conftest import Server
from .test_client import _cli


@pytest.mark.parametrize("command", ["sweep", "infer"])
def test_group_commands_refuse_a_configured_server(command: str, tmp_path: Path) -> None:
    job = tmp_path / "group.yaml"
    job.write_text("name: g\ncommand: python -c pass\nprovider: local\nworkers: 2\noutput: o\n")
    env = {
        **os.environ,
        "SPOTWISE_HOME": str(tmp_path / "home"),
        "SPOTWISE_SERVER": "http://127.0.0.1:9",
        "SPOTWISE_TOKEN": "spw_x",
    }
    refused = _cli(command, str(job), env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert f"spotwise {command} does not run through a server (http://127.0.0.1:9" in refused.stderr
    assert "unset SPOTWISE_SERVER" in refused.stderr and "spw_x" not in refused.stderr
    # logged in instead: the way back is logout
    env.pop("SPOTWISE_SERVER"), env.pop("SPOTWISE_TOKEN")
    login = tmp_path / "home" / "login.json"
    login.parent.mkdir()
    login.write_text(json.dumps({"url": "http://127.0.0.1:9", "token": "spw_x"}))
    assert "spotwise logout" in _cli(command, str(job), env=env).stderr
    assert sorted(p.name for p in login.parent.iterdir()) == ["login.json"]  # nothing ran here


def _dashboard(server: Server, host: str) -> int:
    request = urllib.request.Request(
        server.url + "/", headers={"Authorization": "Bearer admin-token", "Host": host}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_the_dashboard_refuses_foreign_host_names_by_default(server) -> None:
    """Without --allowed-host, a Service's name is as foreign as a rebinding page's (the
    Deployment's names are let in: tests/server/test_deploy.py)."""
    s: Server = server()
    port = s.url.rsplit(":", 1)[1]
    assert _dashboard(s, f"127.0.0.1:{port}") == 200
    assert _dashboard(s, f"localhost:{port}") == 200
    assert _dashboard(s, "spotwise-server.spotwise.svc:8790") == 400
    assert _dashboard(s, "rebound.example.com") == 400
    refused = _cli("server", "--allowed-host", "https://x.example.com", env=dict(os.environ))
    assert refused.returncode == 2 and "--allowed-host 'https://x.example.com'" in refused.stderr
