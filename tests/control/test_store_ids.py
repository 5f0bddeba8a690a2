"""Job ids typed by a user reach the store as text, never as SQL patterns: through the real CLI
and the real dashboard (issue 21: `spotwise cancel '%tim'` cancelled job victim-...)."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from urllib.parse import quote

import pytest

from spotwise.control.store import JobState, Store

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]
LONG_ID = "v" * 50_000


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SPOTWISE, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.usefixtures("store_db")
def test_cancel_with_a_pattern_cancels_nothing():
    store = Store()
    victim = store.create_job("victim", {"command": "sleep 1"}, None)
    out = _cli("cancel", "%tim")
    assert (out.returncode, out.stdout) == (2, "")
    assert "no job '%tim'" in out.stderr and "Traceback" not in out.stderr
    job = store.job(victim.id)
    assert (job.state, job.cancel_requested) == (JobState.PENDING, False)
    assert [e["kind"] for e in store.events(victim.id)] == ["created"]
    status = _cli("status", "vic", "--json")  # the same database, and a prefix still works
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["id"] == victim.id


def test_a_huge_id_is_no_job_not_a_traceback():
    huge = _cli("status", LONG_ID)
    assert huge.returncode == 2 and "no job 'vvvv" in huge.stderr
    assert len(huge.stderr) < 300 and "Traceback" not in huge.stderr


@pytest.fixture()
def dashboard() -> Iterator[tuple[str, int]]:
    proc = subprocess.Popen(
        [*SPOTWISE, "dashboard", "--port", "0"], stdout=subprocess.PIPE, text=True, env=os.environ
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found = re.search(r"http://(127\.0\.0\.1):(\d+)/", line)
        assert found, line
        yield found.group(1), int(found.group(2))
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _get(where: tuple[str, int], path: str) -> int:
    conn = http.client.HTTPConnection(*where, timeout=30)
    conn.request("GET", path)
    status = conn.getresponse().status
    conn.close()
    return status


def test_the_dashboard_answers_404_for_an_id_that_is_a_pattern(dashboard: tuple[str, int]):
    store = Store()
    victim = store.create_job("victim", {"command": "sleep 1"}, None)
    for typed in ("%", "_", "%tim", "__", LONG_ID):
        assert _get(dashboard, f"/api/jobs/{quote(typed, safe='')}") == 404, typed[:10]
        assert _get(dashboard, f"/job/{quote(typed, safe='')}") == 404, typed[:10]
        assert _get(dashboard, f"/api/stream?job={quote(typed, safe='')}") == 404, typed[:10]
    assert _get(dashboard, f"/api/jobs/{victim.id}") == 200
    assert _get(dashboard, "/api/jobs/vic") == 200  # a unique prefix, as the CLI takes
    assert _get(dashboard, "/job/vic") == 200
