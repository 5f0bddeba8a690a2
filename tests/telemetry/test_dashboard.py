"""The dashboard in a real browser: Debian's chromium driven by Playwright, against a store that
holds a finished demo job and a running one, and against one whose run diverged (NaN losses) and
whose data is full of rich markup."""

from __future__ import annotations

import http.client
import json
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from spotwise.control.spec import JobSpec
from spotwise.control.store import Store
from spotwise.telemetry.events import EVENTS_FILE, EventLog
from spotwise.telemetry.jobview import run_dir

from .conftest import MARKUP, SPOTWISE, cli, demo_job_yaml, strict_json
from .tools import chromium, save_screenshot, watch


@contextmanager
def serve(home: Path) -> Iterator[str]:
    """``spotwise dashboard --port 0`` over ``home``; yields its URL once it listens."""
    env = {**os.environ, "SPOTWISE_HOME": str(home)}
    proc = subprocess.Popen(
        [*SPOTWISE, "dashboard", "--port", "0"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = re.search(r"http://127\.0\.0\.1:\d+/", line)
        assert url, line
        yield url.group(0)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture()
def dashboard(demo_home: tuple[Path, str]) -> Iterator[tuple[str, Path]]:
    home, _ = demo_home
    with serve(home) as url:
        yield url, home


def _status(job_id: str, home: Path) -> dict:
    out = cli("status", job_id, "--json", home=home)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _request(url: str, method: str, path: str, headers: dict[str, str | bytes]) -> tuple[int, str]:
    """Status and body (a bytes header value is sent as those bytes, e.g. UTF-8)."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    conn.request(method, path, headers=headers)
    answer = conn.getresponse()
    status, body = answer.status, answer.read().decode()
    conn.close()
    return status, body


def test_dashboard_in_chromium(
    dashboard: tuple[str, Path], demo_home: tuple[Path, str], tmp_path: Path
) -> None:
    url, home = dashboard
    _, done_id = demo_home
    started = cli(
        "launch", "--detach", str(demo_job_yaml(tmp_path, name="running", steps=5000)), home=home
    )
    assert started.returncode == 0, started.stderr
    running_id = started.stdout.strip().splitlines()[-1]
    try:
        with chromium() as browser:
            w = watch(browser)
            page = w.page
            # --- the jobs page: the numbers of `spotwise status --json`
            page.goto(url)
            page.wait_for_selector(f'tr[data-job="{running_id}"]')
            done = _status(done_id, home)
            row = page.locator(f'tr[data-job="{done_id}"]')

            def value(r, cls: str) -> str:
                return r.locator(f"td.{cls}").get_attribute("data-value")

            assert value(row, "state-cell") == done["state"] == "SUCCEEDED"
            assert int(value(row, "attempts")) == len(done["attempts"])
            assert int(value(row, "preemptions")) == done["preemptions"] >= 1
            assert float(value(row, "cost")) == done["cost_usd"]
            assert float(value(row, "savings")) == done["savings_usd"]
            assert row.locator("td.cost").inner_text() == f"${done['cost_usd']:.2f}"
            running_row = page.locator(f'tr[data-job="{running_id}"]')
            assert value(running_row, "state-cell") not in ("SUCCEEDED", "FAILED", "CANCELLED")
            save_screenshot(page, tmp_path, "dashboard-jobs.png")

            # --- the finished job's page: one bar per attempt, a mark per preemption
            page.goto(f"{url}job/{done_id}")
            page.wait_for_selector("#timeline rect.attempt")
            assert page.locator("#timeline rect.attempt").count() == len(done["attempts"])
            assert page.locator("#timeline .preemption").count() == done["preemptions"]
            markets = page.locator("#timeline rect.attempt").evaluate_all(
                "els => els.map(e => e.dataset.market)"
            )
            assert markets == [a["market"] for a in done["attempts"]]
            assert page.locator("#stat-cost .value").inner_text() == f"${done['cost_usd']:.2f}"
            assert page.locator("#chart-progress canvas").count() == 1  # uPlot drew it
            assert page.locator("#chart-loss canvas").count() == 1
            assert "final-weights-sha256" in page.locator("#log").inner_text()
            save_screenshot(page, tmp_path, "dashboard-job.png")

            # --- the running job's page follows it live, without reload
            page.goto(f"{url}job/{running_id}")
            page.wait_for_selector("#cancel")
            rendered = int(page.locator("body").get_attribute("data-rendered"))
            Store(home).event(running_id, "note", "hello from the test")
            page.wait_for_selector('#events li[data-kind="note"]', timeout=20_000)
            assert int(page.locator("body").get_attribute("data-rendered")) > rendered
            assert page.evaluate("performance.getEntriesByType('navigation').length") == 1

            # --- cancel, confirmed in the dialog
            dialogs: list[str] = []

            def accept(dialog) -> None:
                dialogs.append(dialog.message)
                dialog.accept()

            page.on("dialog", accept)
            page.click("#cancel")
            page.wait_for_selector("#cancel-result:has-text('cancel requested')")
            assert dialogs and running_id in dialogs[0]
            # the answer survives the live redraws that the cancel's own event sets off
            Store(home).event(running_id, "note", "a redraw after the cancel")
            page.wait_for_selector("#events li:has-text('a redraw after the cancel')")
            assert "cancel requested" in page.locator("#cancel-result").inner_text()
            assert page.locator("#cancel").count() == 0 or page.locator("#cancel").is_disabled()
            page.wait_for_selector("h1 .state-cancelled", timeout=60_000)
            assert _status(running_id, home)["state"] == "CANCELLED"
            save_screenshot(page, tmp_path, "dashboard-cancelled.png")

            assert w.console_errors == []
            assert all(r.startswith(url) for r in w.requests), w.requests
    finally:
        cli("cancel", running_id, home=home, timeout=120)


def test_cancel_needs_the_session_token_and_host_is_checked(
    dashboard: tuple[str, Path], demo_home: tuple[Path, str]
) -> None:
    url, _ = dashboard
    _, done_id = demo_home
    path = f"/api/jobs/{done_id}/cancel"
    assert _request(url, "POST", path, {})[0] == 403  # no session, no token
    forged = {"Cookie": "spotwise_session=abc", "X-Spotwise-Token": "0" * 64}
    assert _request(url, "POST", path, forged)[0] == 403
    # a token or cookie of any other shape (non-ASCII, raw UTF-8 bytes): 403 saying so, not 500
    session = {"Cookie": "spotwise_session=" + "a" * 32}
    for token in ("tökén", "€ unicode".encode(), "0" * 63 + "\u00e9"):
        status, body = _request(url, "POST", path, {**session, "X-Spotwise-Token": token})
        assert status == 403, body
        assert "X-Spotwise-Token" in strict_json(body)["error"]
    status, body = _request(url, "POST", path, {**forged, "Cookie": "spotwise_session=ü"})
    assert status == 403, body
    assert _request(url, "GET", "/", {"Cookie": "spotwise_session=ü;x=[/]".encode()})[0] == 200
    # a DNS-rebinding page reaches 127.0.0.1 under its own name: refused
    assert _request(url, "GET", "/", {"Host": "attacker.example:8787"})[0] == 400
    assert _request(url, "GET", "/", {"Host": url.removeprefix("http://").rstrip("/")})[0] == 200


def test_a_diverged_run_and_markup_in_chromium(
    diverged_home: tuple[Path, str], tmp_path: Path
) -> None:
    """A run that logged NaN and +-Infinity: valid JSON everywhere (null), the job page draws
    its charts and names the step where the loss diverged, live updates too; markup in the
    command, zone and message shows as written."""
    home, job_id = diverged_home
    with serve(home) as url:
        for path in ("/api/jobs", f"/api/jobs/{job_id}", f"/job/{job_id}"):
            status, body = _request(url, "GET", path, {})
            assert status == 200, (path, body)
            if path.startswith("/api"):
                doc = strict_json(body)
        page_data = re.search(r'<script id="data" type="application/json">(.*?)</script>', body)
        assert page_data and strict_json(page_data.group(1)) == doc
        assert doc["metrics"]["values"]["loss"] == [0.9, 0.5, None, None, None, 1e308, 0.25]
        assert {k: v["value"] for k, v in doc["metrics"]["nonfinite"].items()} == {"loss": "nan"}
        assert doc["metrics"]["nonfinite"]["loss"]["step"] == 20

        with chromium() as browser:
            w = watch(browser)
            page = w.page
            page.goto(url)
            row = page.locator(f'tr[data-job="{job_id}"]')
            assert row.locator("td.state-cell").get_attribute("data-value") == "FAILED"
            page.goto(f"{url}job/{job_id}")
            page.wait_for_selector("#chart-loss canvas")
            note = page.locator("#nonfinite").inner_text()
            assert "loss became nan at step 20" in note and "gap" in note
            assert MARKUP in page.locator("p.message").inner_text()
            assert MARKUP in page.locator("#timeline text.zone").text_content()
            # a live update carrying another NaN redraws the page (the stream is JSON too)
            rendered = int(page.locator("body").get_attribute("data-rendered"))
            job = Store(home).job(job_id)
            directory = run_dir(job, JobSpec.model_validate(job.spec))
            assert directory is not None
            events = EventLog(directory / EVENTS_FILE)
            events.emit("metrics", step=70, values={"loss": float("nan")})
            page.wait_for_selector(f'body[data-rendered="{rendered + 1}"]', timeout=20_000)
            assert page.locator("#chart-loss canvas").count() == 1
            save_screenshot(page, tmp_path, "dashboard-diverged.png")
            assert w.console_errors == []
