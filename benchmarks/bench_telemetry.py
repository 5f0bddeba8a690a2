#!/usr/bin/env python
"""Telemetry costs, each against a baseline measured in the same run.

1. Training overhead: the digits example's step throughput with the training metrics endpoint
   (scraped every second, as Prometheus would) and GPU sampling on, against both off. Two
   throughputs per run: steps per second of CPU the training process used from its ``start``
   event to its exit (every thread counted: the sampler's and the server's work is in it), and
   steps per wall second between its ``start`` and ``finished`` events. ``ratio-metrics-overhead``
   is the CPU one: on a shared machine the wall clock mostly measures the neighbours (single
   runs there vary by 2x). Runs alternate on/off; ratios are medians of back-to-back pairs.
   ``--fake-nvml`` samples the gcc-built fake NVML library of the tests where the machine has no
   GPU; on a GPU machine the real driver is sampled.
2. Dashboard: the job page of a job with ``--attempts`` attempts and ``--events`` runtime events
   rendered in chromium (navigation until the timeline is drawn), against the jobs page of an
   empty store.

    python benchmarks/bench_telemetry.py [--steps 3000] [--pairs 3] [--fake-nvml]

Prints ``name: value`` lines, among them ``ratio-metrics-overhead: X`` (>= 0.99 is the target)
and ``ratio-dashboard-big-job-vs-empty: X``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPOTWISE = [sys.executable, "-c", "from spotwise.cli.main import main; main()"]
sys.path.insert(0, str(ROOT))  # the tests' chromium and fake NVML helpers
from tests.telemetry.tools import build_fake_nvml, chromium  # noqa: E402


def steps_per_s(run_dir: Path) -> float:
    from spotwise.telemetry.events import read_events

    events = read_events(run_dir / "events.jsonl")
    start = next(e for e in events if e["kind"] == "start")
    end = next(e for e in events if e["kind"] == "finished")
    return (end["step"] - start["step"]) / (end["time"] - start["time"])


def scrape_forever(run_dir: Path, stop: threading.Event) -> None:
    from spotwise.telemetry.events import read_events

    port = None
    while not stop.is_set():
        if port is None:
            found = read_events(run_dir / "events.jsonl", "metrics-endpoint")
            port = found[0]["port"] if found else None
        else:
            with contextlib.suppress(OSError):  # the run has ended
                urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read()
        stop.wait(1.0 if port else 0.05)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process, all its threads (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def train_once(tmp: Path, steps: int, on: bool, nvml_dir: Path | None) -> tuple[float, float]:
    """Steps per wall second and per CPU second of the training loop, one run."""
    run_dir = Path(tempfile.mkdtemp(dir=tmp))
    env = {**os.environ, "SPOTWISE_PLATFORM": "none", "SPOTWISE_GPU_SAMPLE_S": "0"}
    if on:
        env.update(SPOTWISE_METRICS_PORT="0", SPOTWISE_GPU_SAMPLE_S="2")
        if nvml_dir is not None:
            env["LD_LIBRARY_PATH"] = str(nvml_dir)
    stop = threading.Event()
    scraper = threading.Thread(target=scrape_forever, args=(run_dir, stop), daemon=True)
    if on:
        scraper.start()
    argv = [
        sys.executable,
        str(ROOT / "examples/digits/train.py"),
        "--run-dir",
        str(run_dir),
        "--steps",
        str(steps),
        "--save-every",
        "200",
    ]
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL)
    events = run_dir / "events.jsonl"
    cpu_at_start = None
    while cpu_at_start is None:  # the CPU the process had used when its loop began
        if events.exists() and '"kind":"start"' in events.read_text():
            cpu_at_start = _cpu_s(proc.pid)
        time.sleep(0.005)
    _, status, usage = os.wait4(proc.pid, 0)  # its CPU at exit, every thread counted
    proc.returncode = os.waitstatus_to_exitcode(status)
    assert proc.returncode == 0, f"training failed ({proc.returncode})"
    stop.set()
    if on:
        scraper.join()
    cpu = usage.ru_utime + usage.ru_stime - cpu_at_start
    return steps_per_s(run_dir), steps / cpu


def overhead(tmp: Path, steps: int, pairs: int, nvml_dir: Path | None) -> None:
    wall: dict[bool, list[float]] = {True: [], False: []}
    cpu: dict[bool, list[float]] = {True: [], False: []}
    for i in range(pairs):
        order = (True, False) if i % 2 == 0 else (False, True)
        for on in order:
            w, c = train_once(tmp, steps, on, nvml_dir)
            wall[on].append(w)
            cpu[on].append(c)
    wall_ratios = [a / b for a, b in zip(wall[True], wall[False], strict=True)]
    cpu_ratios = [a / b for a, b in zip(cpu[True], cpu[False], strict=True)]
    for name, d in (("wall", wall), ("cpu", cpu)):
        print(f"digits-steps-per-{name}-s-telemetry-off: {statistics.median(d[False]):.1f}")
        print(f"digits-steps-per-{name}-s-telemetry-on: {statistics.median(d[True]):.1f}")
    print(f"ratio-metrics-overhead: {statistics.median(cpu_ratios):.3f}")
    print(
        f"ratio-metrics-overhead-pairs: {min(cpu_ratios):.3f}..{max(cpu_ratios):.3f} "
        f"({pairs} pairs)"
    )
    print(
        f"ratio-metrics-overhead-wall: {statistics.median(wall_ratios):.3f} "
        f"(pairs {min(wall_ratios):.3f}..{max(wall_ratios):.3f})"
    )


def big_store(home: Path, attempts: int, events: int) -> str:
    """A store with one finished job of ``attempts`` attempts and ``events`` runtime events."""
    os.environ["SPOTWISE_HOME"] = str(home)
    from spotwise.control.store import JobState, Store
    from spotwise.telemetry.events import EVENTS_FILE

    store = Store(home)
    t0 = time.time() - attempts * 60.0
    spec = {
        "name": "big",
        "command": ["python", "train.py"],
        "provider": {"name": "local"},
        "deadline_s": attempts * 70.0,
        "expected_runtime_s": attempts * 50.0,
    }
    job = store.create_job("big", spec, None, now=t0)
    zones = ["us-east-1a", "us-east-1b", "us-east-2a", "us-west-2c"]
    lines: list[dict] = []
    per = max(1, events // attempts)
    step = 0
    for n in range(1, attempts + 1):
        start = t0 + (n - 1) * 60.0
        market = "on-demand" if n % 10 == 0 else "spot"
        store.open_attempt(
            job.id,
            provider="sim",
            market=market,
            zone=zones[n % 4],
            usd_per_hour=0.9 if market == "spot" else 3.06,
            ondemand_usd_per_hour=3.06,
            time_scale=1.0,
            now=start,
        )
        store.update_attempt(
            job.id,
            n,
            state="ended",
            running_at=start + 2,
            ended_at=start + 58,
            reason="preempted" if n < attempts else "succeeded",
            exit_code=75 if n < attempts else 0,
        )
        lines.append({"time": start + 5, "kind": "start", "step": step, "restore_s": 0.5})
        for k in range(per - 2):
            t = start + 5 + 50.0 * (k + 1) / per
            step += 1
            if k % 5 == 0:
                lines.append(
                    {
                        "time": t,
                        "kind": "checkpoint",
                        "step": step,
                        "write_s": 0.01,
                        "stall_s": 0.001,
                        "bytes": 110_000,
                        "reason": "interval",
                    }
                )
            elif k % 5 == 1:
                device = {
                    "index": 0,
                    "util_pct": 60 + k % 30,
                    "mem_used_bytes": 8 * 10**9,
                    "mem_total_bytes": 16 * 10**9,
                }
                lines.append({"time": t, "kind": "gpu", "devices": [device]})
            else:
                lines.append(
                    {"time": t, "kind": "metrics", "step": step, "values": {"loss": 1 / step}}
                )
        lines.append({"time": start + 56, "kind": "interrupted", "step": step, "source": "sim"})
    run_dir = job.dir / "checkpoint"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / EVENTS_FILE).write_text("".join(json.dumps(e) + "\n" for e in lines))
    store.update_job(job.id, state=JobState.SUCCEEDED, now=t0 + attempts * 60.0)
    print(f"dashboard-big-job-events: {len(lines)}")
    return job.id


def render_ms(home: Path, path: str, selector: str, reps: int) -> float:
    env = {**os.environ, "SPOTWISE_HOME": str(home)}
    server = subprocess.Popen(
        [*SPOTWISE, "dashboard", "--port", "0"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        url = re.search(r"http://127\.0\.0\.1:\d+/", server.stdout.readline())
        assert url is not None
        times = []
        with chromium() as browser:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            for _ in range(reps + 1):  # the first load warms the server and the browser
                started = time.perf_counter()
                page.goto(url.group(0) + path.lstrip("/"))
                page.wait_for_selector(selector)
                times.append(time.perf_counter() - started)
        return 1000 * statistics.median(times[1:])
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--attempts", type=int, default=1000)
    parser.add_argument("--events", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--fake-nvml", action="store_true")
    parser.add_argument("--skip-dashboard", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        nvml_dir = build_fake_nvml(tmp / "nvml") if args.fake_nvml else None
        overhead(tmp, args.steps, args.pairs, nvml_dir)
        if args.skip_dashboard:
            return
        empty = render_ms(tmp / "empty", "/", "body[data-rendered]", args.reps)
        job_id = big_store(tmp / "big", args.attempts, args.events)
        big = render_ms(tmp / "big", f"/job/{job_id}", "#timeline rect.attempt", args.reps)
        print(f"dashboard-empty-jobs-page-ms: {empty:.0f}")
        print(f"dashboard-job-page-{args.attempts}-attempts-ms: {big:.0f}")
        print(f"ratio-dashboard-big-job-vs-empty: {big / empty:.1f}")


if __name__ == "__main__":
    main()
