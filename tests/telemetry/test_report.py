"""``spotwise report``: the self-contained HTML opened in chromium (charts drawn, no network),
the PNG charts, and the terminal/JSON goodput table; and the same for a run that diverged."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from .conftest import MARKUP, cli, strict_json
from .tools import chromium, save_screenshot, watch


def test_report_html_offline_png_and_table(demo_home: tuple[Path, str], tmp_path: Path) -> None:
    import matplotlib.image

    home, job_id = demo_home
    out, png = tmp_path / "report.html", tmp_path / "png"
    made = cli("report", job_id, "--html", str(out), "--png", str(png), home=home)
    assert made.returncode == 0, made.stderr
    ledger = json.loads(cli("report", job_id, "--json", home=home).stdout)
    assert sum(ledger["seconds"].values()) == pytest.approx(ledger["wall_s"], abs=1e-4)
    status = json.loads(cli("status", job_id, "--json", home=home).stdout)

    with chromium() as browser:
        w = watch(browser)
        page = w.page
        page.goto(out.as_uri())
        page.wait_for_selector("#timeline rect.attempt")
        assert page.locator("#timeline rect.attempt").count() == len(status["attempts"])
        for chart in ("chart-progress", "chart-cost", "chart-loss"):
            assert page.locator(f"#{chart} canvas").count() == 1, chart
        for kind in ("useful", "lost", "restore", "changeover", "idle"):
            cell = page.locator(f'#goodput tr[data-kind="{kind}"] td.seconds')
            assert float(cell.get_attribute("data-value")) == ledger["seconds"][kind]
        assert page.locator("#cancel").count() == 0  # a report is read only
        assert "no GPU samples" in page.locator("#rightsizing").inner_text()
        save_screenshot(page, tmp_path, "report.png")
        assert w.console_errors == []
        assert w.requests == [out.as_uri()], w.requests  # the file itself, nothing else

    names = sorted(p.name for p in png.iterdir())
    assert names == ["cost.png", "goodput.png", "metrics.png", "timeline.png"]  # no GPU here
    image = matplotlib.image.imread(png / "timeline.png")
    assert image.shape[1] == 9 * 120 and image.std() > 0.05  # drawn, not blank

    text = cli("report", job_id, home=home)
    assert text.returncode == 0
    assert "goodput" in text.stdout and "changeover" in text.stdout
    assert "rightsizing: no GPU samples" in text.stdout


def test_report_of_a_diverged_run(diverged_home: tuple[Path, str], tmp_path: Path) -> None:
    """NaN and +-Infinity in the run's metrics: the HTML's data is JSON a browser parses (the
    page draws, naming the step; blank before), and the PNGs are drawn."""
    home, job_id = diverged_home
    out, png = tmp_path / "report.html", tmp_path / "png"
    made = cli("report", job_id, "--html", str(out), "--png", str(png), home=home)
    assert made.returncode == 0, made.stderr
    block = re.search(r'<script id="data" type="application/json">(.*?)</script>', out.read_text())
    assert block is not None
    doc = strict_json(block.group(1))
    assert isinstance(doc, dict) and doc["metrics"]["values"]["loss"][2:5] == [None] * 3
    assert sorted(p.name for p in png.iterdir()) == [
        "cost.png",
        "goodput.png",
        "metrics.png",
        "timeline.png",
    ]

    with chromium() as browser:
        w = watch(browser)
        page = w.page
        page.goto(out.as_uri())
        page.wait_for_selector("#chart-loss canvas")
        assert "loss became nan at step 20" in page.locator("#nonfinite").inner_text()
        assert MARKUP in page.locator("p.message").inner_text()
        assert MARKUP in page.locator("#chart-loss .u-legend").inner_text()
        save_screenshot(page, tmp_path, "report-diverged.png")
        assert w.console_errors == []
        assert w.requests == [out.as_uri()], w.requests
