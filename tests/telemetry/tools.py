"""Test tools shared with the benchmark: Debian's chromium driven by Playwright for Python (no
browser download), the gcc-built fake NVML library, a tiny training script."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@dataclass
class Watched:
    page: Any
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)


@contextmanager
def chromium() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert Path(CHROMIUM).exists(), "install it: apt-get install -y chromium (.ci/run does)"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            yield browser
        finally:
            browser.close()


def watch(browser: Any, width: int = 1200, height: int = 900) -> Watched:
    """A new page that records console errors, uncaught exceptions and every request."""
    page = browser.new_page(viewport={"width": width, "height": height})
    w = Watched(page)
    page.on("console", lambda m: w.console_errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: w.console_errors.append(f"uncaught: {e}"))
    page.on("request", lambda r: w.requests.append(r.url))
    return w


def save_screenshot(page: Any, tmp: Path, name: str) -> Path:
    """Into the test's tmp dir, and into $SPOTWISE_ARTIFACTS when set (CI, docs/img)."""
    path = tmp / name
    page.screenshot(path=str(path), full_page=True)
    target = os.environ.get("SPOTWISE_ARTIFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(target) / name)
    return path


def build_fake_nvml(out: Path) -> Path:
    """``out/libnvidia-ml.so.1`` from fake_nvml.c: put ``out`` on LD_LIBRARY_PATH."""
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            "gcc",
            "-shared",
            "-fPIC",
            "-O1",
            "-o",
            str(out / "libnvidia-ml.so.1"),
            str(HERE / "fake_nvml.c"),
        ],
        check=True,
    )
    return out


# python -c TRAIN RUN_DIR STEPS SLEEP_S: a small real Run that logs its loss every step
TRAIN = """
import sys, time, torch
from spotwise import CheckpointConfig, Run
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
run = Run(sys.argv[1], state={"model": model, "optimizer": opt}, steps=int(sys.argv[2]),
          checkpoint=CheckpointConfig(every=20), notices=None)
for step in run:
    loss = (model(torch.ones(2, 4)) ** 2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    run.log(loss=loss.item())
    time.sleep(float(sys.argv[3]))
"""
