"""``spotwise users`` and ``spotwise tokens`` through the real command."""

from __future__ import annotations

import json
import subprocess
import sys

from spotwise.control.store import Store
from spotwise.server.auth import principal_for
from spotwise.server.principal import Principal

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPOTWISE, *args], capture_output=True, text=True, timeout=120)


def test_users_and_tokens_from_the_command_line():
    assert _cli("users", "add", "alice", "--role", "user").returncode == 0
    bad = _cli("users", "add", "bob", "--role", "boss")
    assert bad.returncode == 2 and "'boss' is not one of admin, user, viewer" in bad.stderr
    assert "Traceback" not in bad.stderr

    made = _cli("tokens", "create", "alice", "--name", "laptop", "--expires", "30d")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()  # stdout is the token alone (for scripts), once
    assert principal_for(Store(), token) == Principal("alice", "user")
    [listed] = json.loads(_cli("tokens", "list", "--json").stdout)
    assert token not in json.dumps(listed)
    assert (listed["user"], listed["name"], listed["state"]) == ("alice", "laptop", "active")
    assert listed["expires_at"] - listed["created_at"] == 30 * 86400

    for args, needle in [
        (("tokens", "create", "alice", "--expires", "soon"), "--expires: 'soon' is not a duration"),
        (("tokens", "revoke", listed["id"][:6]), f"no token '{listed['id'][:6]}'"),
    ]:
        out = _cli(*args)
        assert (out.returncode, out.stdout) == (2, ""), args
        assert needle in out.stderr and "Traceback" not in out.stderr

    assert _cli("tokens", "revoke", listed["id"]).returncode == 0
    assert principal_for(Store(), token) is None
    hook = _cli("users", "notify", "alice", "--url-from", "env:SLACK", "--states", "failed")
    assert hook.returncode == 0, hook.stderr
    bad = _cli("users", "notify", "alice", "--url", "ftp://x", "--states", "DONE")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert "--url: expected an http:// or https:// URL" in bad.stderr
    assert "--states: 'DONE': not a state; allowed: LAUNCHING" in bad.stderr
    [user] = json.loads(_cli("users", "list", "--json").stdout)
    assert (user["name"], user["role"]) == ("alice", "user")
    [webhook] = user["notify"]["webhooks"]  # the bad one was not added
    assert (webhook["url_from"], webhook["states"]) == ("env:SLACK", ["FAILED"])
