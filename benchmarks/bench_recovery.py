"""Controller overhead on recovery: from an attempt's exit 75 to the next attempt's step 1.

    python benchmarks/bench_recovery.py [--provider local|sim] [--preemptions 10]

A stand-in training process logs wall-clock timestamps: when it started, when its "restore" was
done, its step 1, and the instant before it exits 75. The controller records when it launched
each attempt. Per recovery:

    total       = step 1 of attempt n+1  - exit of attempt n
    controller  = launch of attempt n+1  - exit of attempt n   (notice the exit, decide, record)
    provider    = process start          - launch              (machine + interpreter start)
    restore     = step 1                 - process start       (the job's own restore)

Baseline, measured in the same run: a bare shell-style loop that reruns the same script as soon
as it exits 75 (no database, no supervisor), whose total is the floor for any controller.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

STANDIN = textwrap.dedent("""
    import json, os, sys, time
    t0 = time.time()
    marks = os.environ["BENCH_MARKS"]
    runs = sum(1 for _ in open(marks)) if os.path.exists(marks) else 0
    restored = time.time()
    step1 = time.time()
    time.sleep(0.2)  # some training
    code = 75 if runs < int(os.environ["BENCH_N"]) else 0
    with open(marks, "a") as f:
        f.write(json.dumps({"start": t0, "restored": restored, "step1": step1,
                            "exit": time.time()}) + "\\n")
    sys.exit(code)
""")


def _median_ms(xs: list[float]) -> float:
    return statistics.median(xs) * 1000.0


def bare_loop(script: Path, marks: Path, n: int) -> list[float]:
    env = {**os.environ, "BENCH_MARKS": str(marks), "BENCH_N": str(n)}
    while subprocess.run([sys.executable, str(script)], env=env).returncode == 75:
        pass
    rows = [json.loads(line) for line in marks.read_text().splitlines()]
    return [b["step1"] - a["exit"] for a, b in itertools.pairwise(rows)]


def controller_run(script: Path, marks: Path, n: int, provider: str) -> dict[str, list[float]]:
    from spotwise.control.controller import Controller
    from spotwise.control.spec import parse_spec
    from spotwise.control.store import Store
    from spotwise.control.submission import submit

    options: dict = {"name": provider}
    if provider == "sim":  # on-demand: nothing but the job's own exits interrupts it
        options.update(boot_s=0, zones=["us-east-1a"])
    spec = parse_spec(
        {
            "name": "bench",
            "command": ["python", str(script)],
            "provider": options,
            "market": "on-demand" if provider == "sim" else "auto",
            "env": {"BENCH_MARKS": str(marks), "BENCH_N": str(n)},
        },
        base_dir=script.parent,
    )
    store = Store()
    job = submit(store, spec)
    Controller(store, job.id).run()
    attempts = store.attempts(job.id)
    rows = [json.loads(line) for line in marks.read_text().splitlines()]
    out: dict[str, list[float]] = {"total": [], "controller": [], "provider": [], "restore": []}
    for i in range(len(rows) - 1):
        prev, nxt, launch = rows[i], rows[i + 1], attempts[i + 1].started_at
        out["total"].append(nxt["step1"] - prev["exit"])
        out["controller"].append(launch - prev["exit"])
        out["provider"].append(nxt["start"] - launch)
        out["restore"].append(nxt["step1"] - nxt["start"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", default="local", choices=["local", "sim"])
    parser.add_argument("--preemptions", type=int, default=10)
    args = parser.parse_args()
    os.environ["SPOTWISE_PLATFORM"] = "none"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["SPOTWISE_HOME"] = str(Path(tmp) / "home")
        script = Path(tmp) / "standin.py"
        script.write_text(STANDIN)
        base = bare_loop(script, Path(tmp) / "bare.jsonl", args.preemptions)
        ctl = controller_run(script, Path(tmp) / "ctl.jsonl", args.preemptions, args.provider)
    n = len(ctl["total"])
    print(f"recoveries measured: {n} on provider {args.provider} (medians)")
    print(f"  baseline (bare relaunch loop) exit 75 -> step 1: {_median_ms(base):8.1f} ms")
    print(
        f"  spotwise                       exit 75 -> step 1: {_median_ms(ctl['total']):8.1f} ms"
        f"  ({statistics.median(ctl['total']) / statistics.median(base):.2f}x baseline)"
    )
    print(f"    provider start (machine + interpreter): {_median_ms(ctl['provider']):8.1f} ms")
    print(f"    restore (script start to step 1):       {_median_ms(ctl['restore']):8.1f} ms")
    overhead = _median_ms(ctl["controller"])
    print(
        f"  controller overhead (total - provider start - restore): {overhead:.1f} ms "
        f"(max {max(ctl['controller']) * 1000:.1f} ms; target < 1000 ms: "
        f"{'met' if max(ctl['controller']) < 1.0 else 'NOT met'})"
    )


if __name__ == "__main__":
    main()
