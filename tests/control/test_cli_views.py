"""What the job commands print when the data is hostile: rich markup, emoji codes and terminal
escapes in commands, zones and messages print as written; an 80-column terminal still shows
every job id whole (the one thing a user copies from ``spotwise jobs``); ``--json`` is strict."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from spotwise.control.store import JobState, Store

SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]
MARKUP = "[/] [bold red]x[/bold red] [link=https://example.invalid]y[/link] :smile:"
ESCAPE = "\x1b[31m\x1b]0;title\x07"


def _cli(*args: str, columns: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": str(columns)}
    return subprocess.run([*SPOTWISE, *args], capture_output=True, text=True, timeout=120, env=env)


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def _jobs(store: Store, command: list[str], names: tuple[str, ...]) -> list[str]:
    now = time.time()
    spec = {"command": command, "provider": "local"}
    return [store.create_job(n, {**spec, "name": n}, None, now=now).id for n in names]


def test_jobs_shows_whole_ids_in_80_columns() -> None:
    """The README's digits job, twice: each id was cut to "digits…" in 80 columns."""
    store = Store()
    ids = _jobs(store, ["python", "train.py", "--steps", "400", "--save-every", "10"],
                ("digits", "digits", "a" * 24))  # fmt: skip
    narrow = _cli("jobs", columns=80)
    assert narrow.returncode == 0, narrow.stderr
    assert all(len(line) <= 80 for line in narrow.stdout.splitlines())
    for job_id in ids:
        assert f" {job_id} " in narrow.stdout
        assert f"spotwise resume {job_id}" in narrow.stdout  # no controller: told how to resume


def test_jobs_and_status_print_user_data_literally() -> None:
    """One job whose command held "[/]" made `spotwise jobs` raise MarkupError for all."""
    store = Store()
    ids = _jobs(store, ["python", "train.py", MARKUP, ESCAPE], ("a" * 24, "digits"))
    now = time.time()
    attempt = store.open_attempt(
        ids[0], provider="local", market="spot", zone=MARKUP, usd_per_hour=1.0,
        ondemand_usd_per_hour=3.0, time_scale=1.0, now=now,
    )  # fmt: skip
    store.update_attempt(ids[0], attempt.n, state="ended", ended_at=now + 1, reason="failed")
    store.update_job(ids[0], state=JobState.FAILED, message=f"diverged {MARKUP} {ESCAPE}")

    wide = _cli("jobs", columns=250)
    assert wide.returncode == 0, wide.stderr
    assert all(job_id in wide.stdout for job_id in ids)
    assert "[/] [bold red]x[/bold red] [link=https://ex" in wide.stdout  # its first 60 chars
    status = _cli("status", ids[0], columns=250)
    assert status.returncode == 0, status.stderr
    assert status.stdout.count(MARKUP) == 3  # the message, the placement, the attempt row
    assert "\\x1b[31m" in status.stdout  # the escape shown, not sent to the terminal
    for out in (wide.stdout, status.stdout):
        assert "\x1b" not in out and "😄" not in out

    rows = _strict(_cli("jobs", "--json", columns=80).stdout)
    assert isinstance(rows, list) and {r["id"] for r in rows} == set(ids)
