"""Interruption notices: how fast a notice becomes a durable emergency checkpoint.

Measured in this run, over real loopback HTTP (the platform emulators) and real signals:

1. **Detection latency** at the default poll intervals (AWS 1 s, Azure 1 s, GCP long-poll,
   signals): time from a notice becoming visible at the endpoint to ``Watcher.current()``
   returning it, over ``--trials`` notices at random poll phases (p50 / p90 / max).
2. **Example script** (``examples/digits/train.py --step-sleep``): notice visible -> emergency
   checkpoint durable (the ``checkpoint`` event with reason ``notice`` is written after the
   commit and fsync), against the step time and the save time measured in the same run.
3. **~1 GiB state** in-process with ``spotwise.Run``: the same, against a blocking save of the
   same state measured just before.

The target is notice-to-durable <= one step + one save + 0.5 s (``ratio-vs-target`` <= 1.0) once
the notice is detected; for polled platforms the detection latency (part 1) comes on top.

    .venv/bin/python benchmarks/bench_notices.py            # ~2-3 minutes
    .venv/bin/python benchmarks/bench_notices.py --quick    # fewer trials, 256 MiB state
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ["SPOTWISE_PLATFORM"] = "none"  # never probe link-local metadata from a benchmark
os.environ.setdefault("NO_PROXY", "127.0.0.1,localhost")
for _var in (
    "AWS_EC2_METADATA_SERVICE_ENDPOINT",
    "GCE_METADATA_HOST",
    "SPOTWISE_AZURE_METADATA_ENDPOINT",
):
    os.environ.pop(_var, None)

REPO = Path(__file__).resolve().parents[1]
TRAIN = REPO / "examples" / "digits" / "train.py"
GiB = 1024**3
POLL_S = {"signal": 0.0, "aws": 1.0}  # default poll intervals (signals are immediate)


# --- 1. detection latency ----------------------------------------------------------------------
def detection_latencies(platform: str, trials: int) -> list[float]:
    from spotwise.emulators import EMULATORS
    from spotwise.notices.watcher import watch_from_environment

    out = []
    for _ in range(trials):
        emu: Any = None
        env = {"SPOTWISE_PLATFORM": "none"}
        if platform != "signal":
            emu = EMULATORS[platform](port=0)
            url = emu.start()
            var = {
                "aws": ("AWS_EC2_METADATA_SERVICE_ENDPOINT", url),
                "gcp": ("GCE_METADATA_HOST", url.removeprefix("http://")),
                "azure": ("SPOTWISE_AZURE_METADATA_ENDPOINT", url),
            }[platform]
            env[var[0]] = var[1]
        watcher = watch_from_environment(env)
        try:
            time.sleep(0.3 + random.uniform(0.0, 1.0))  # first poll done; random poll phase
            started = time.monotonic()
            if emu is not None:
                emu.trigger_notice()
            else:
                os.kill(os.getpid(), signal.SIGTERM)
            while watcher.current() is None:
                if time.monotonic() - started > 30:
                    raise RuntimeError(f"{platform}: notice not seen within 30 s")
                time.sleep(0.001)
            out.append(time.monotonic() - started)
        finally:
            watcher.close()
            if emu is not None:
                emu.stop()
    return out


# --- 2. the example script ---------------------------------------------------------------------
def read_events(run_dir: Path) -> list[dict[str, Any]]:
    from spotwise.telemetry.events import read_events as read

    return read(run_dir / "events.jsonl")


def example_once(source: str, step_sleep: float) -> dict[str, float]:
    from spotwise.emulators import AwsImdsEmulator
    from spotwise.runtime import list_checkpoints

    with tempfile.TemporaryDirectory(prefix="bench-notices-") as tmp:
        run_dir = Path(tmp) / "run"
        env = dict(os.environ)
        emu = None
        if source == "aws":
            emu = AwsImdsEmulator(port=0)
            env["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = emu.start()
        argv = [sys.executable, str(TRAIN), "--run-dir", str(run_dir), "--steps", "400"]
        argv += ["--save-every", "10", "--step-sleep", str(step_sleep)]
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            while len(list_checkpoints(run_dir) if run_dir.exists() else []) < 2:
                if proc.poll() is not None:
                    raise RuntimeError(proc.stderr.read().decode()[-2000:])  # type: ignore[union-attr]
                time.sleep(0.02)
            time.sleep(random.uniform(0.0, 1.0))
            if emu is not None:
                emu.trigger_notice()
                while emu.notice_visible_wall is None:
                    time.sleep(0.001)
                visible = emu.notice_visible_wall
            else:
                visible = time.time()
                proc.send_signal(signal.SIGTERM)
            code = proc.wait(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            if emu is not None:
                emu.stop()
        if code != 75:
            raise RuntimeError(f"example exited {code}, expected 75")
        events = read_events(run_dir)
        saves = [e for e in events if e["kind"] == "checkpoint"]
        notice_save = next(e for e in reversed(saves) if e["reason"] == "notice")
        periodic = [e for e in saves if e["reason"] == "interval"]
        step_s = (periodic[-1]["time"] - periodic[0]["time"]) / (
            periodic[-1]["step"] - periodic[0]["step"]
        )
        save_s = notice_save["stall_s"] + notice_save["write_s"]
        return {
            "notice_to_durable_s": notice_save["time"] - visible,
            "step_s": step_s,
            "save_s": save_s,
        }


# --- 3. ~1 GiB state in-process ----------------------------------------------------------------
class FirstSeen:
    """Wraps the watcher Run uses, recording when ``current()`` first returned a notice."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen_wall: float | None = None

    def current(self) -> Any:
        notice = self.inner.current()
        if notice is not None and self.seen_wall is None:
            self.seen_wall = time.time()
        return notice

    def acknowledge(self, notice: Any) -> None:
        self.inner.acknowledge(notice)

    def close(self) -> None:
        self.inner.close()


def big_state_once(source: str, gib: float, step_s: float) -> dict[str, float]:
    import torch

    from spotwise.emulators import AwsImdsEmulator
    from spotwise.notices.watcher import watch_from_environment
    from spotwise.runtime import CheckpointConfig, Run

    chunks = max(1, round(gib * 4))
    params = torch.nn.ParameterList(
        [torch.nn.Parameter(torch.randn(int(GiB / 4 / 4))) for _ in range(chunks)]
    )
    emu = None
    if source == "aws":
        emu = AwsImdsEmulator(port=0)
        os.environ["AWS_EC2_METADATA_SERVICE_ENDPOINT"] = emu.start()
    visible: list[float] = []

    def deliver() -> None:
        if emu is not None:
            emu.trigger_notice()
            while emu.notice_visible_wall is None:
                time.sleep(0.001)
            visible.append(emu.notice_visible_wall)
        else:
            visible.append(time.time())
            os.kill(os.getpid(), signal.SIGTERM)

    with tempfile.TemporaryDirectory(prefix="bench-notices-big-") as tmp:
        watcher = FirstSeen(watch_from_environment())
        config = CheckpointConfig(every=10**9)
        run = Run(
            Path(tmp) / "run",
            state={"model": params},
            steps=10_000,
            checkpoint=config,
            notices=watcher,
        )
        baseline: list[float] = []  # blocking saves of the same state, same disk, same run
        timer: threading.Timer | None = None
        code = None
        try:
            for step in run:
                with torch.no_grad():
                    params[0][:1024].add_(1e-3)
                time.sleep(step_s)
                if step < 3:
                    started = time.perf_counter()
                    run.save(block=True)
                    baseline.append(time.perf_counter() - started)
                elif timer is None:
                    timer = threading.Timer(random.uniform(0.0, step_s), deliver)
                    timer.start()
        except SystemExit as exit_:
            code = exit_.code
        finally:
            os.environ.pop("AWS_EC2_METADATA_SERVICE_ENDPOINT", None)
            if emu is not None:
                emu.stop()
        save_s = statistics.median(baseline)
        if code != 75:
            raise RuntimeError(f"Run ended with {code}, expected exit 75")
        events = read_events(Path(tmp) / "run")
        notice_save = next(
            e for e in events if e["kind"] == "checkpoint" and e["reason"] == "notice"
        )
        size = notice_save["bytes"]
    assert watcher.seen_wall is not None
    return {
        "notice_to_durable_s": notice_save["time"] - visible[0],
        "detected_to_durable_s": notice_save["time"] - watcher.seen_wall,
        "step_s": step_s,
        "save_s": save_s,
        "emergency_save_s": notice_save["stall_s"] + notice_save["write_s"],
        "bytes": float(size),
    }


# --- report ------------------------------------------------------------------------------------
def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, round(0.9 * (len(ordered) - 1)))]
    return (
        f"p50 {statistics.median(ordered) * 1000:7.1f} ms  p90 {p90 * 1000:7.1f} ms  "
        f"max {ordered[-1] * 1000:7.1f} ms  (n={len(ordered)})"
    )


def report(label: str, runs: list[dict[str, float]], poll_s: float) -> None:
    def med(key: str) -> float:
        return statistics.median(r[key] for r in runs)

    n2d, step, save = med("notice_to_durable_s"), med("step_s"), med("save_s")
    target = step + save + 0.5
    print(
        f"{label}: notice-to-durable {n2d:.3f} s (median of {len(runs)}; "
        f"max {max(r['notice_to_durable_s'] for r in runs):.3f} s), step {step:.3f} s, "
        f"save alone {save:.3f} s"
    )
    print(f"  ratio-vs-save-alone {n2d / save:.2f}")
    print(f"  ratio-vs-target (step + save + 0.5 s = {target:.3f} s) {n2d / target:.2f}")
    if poll_s:
        print(
            f"  ratio-vs-target-plus-poll-interval ({target + poll_s:.3f} s) "
            f"{n2d / (target + poll_s):.2f}"
        )
    if "detected_to_durable_s" in runs[0]:
        d2d, emergency = med("detected_to_durable_s"), med("emergency_save_s")
        print(
            f"  visible-to-step-boundary {n2d - d2d:.3f} s (detection + rest of the step), "
            f"boundary-to-durable {d2d:.3f} s (the emergency save itself {emergency:.3f} s)"
        )
        print(f"  ratio-emergency-save-vs-save-alone {emergency / save:.2f}")
        print(
            f"  ratio-vs-target-with-this-save (step + emergency save + 0.5 s"
            f"{' + poll' if poll_s else ''} = {step + emergency + 0.5 + poll_s:.3f} s) "
            f"{n2d / (step + emergency + 0.5 + poll_s):.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=12, help="notices per platform (part 1)")
    parser.add_argument("--runs", type=int, default=3, help="example runs per source (part 2)")
    parser.add_argument("--gib", type=float, default=1.0, help="state size for part 3")
    parser.add_argument("--step-sleep", type=float, default=0.1, help="example step sleep")
    parser.add_argument("--quick", action="store_true", help="5 trials, 1 run, 0.25 GiB")
    args = parser.parse_args()
    if args.quick:
        args.trials, args.runs, args.gib = 5, 1, 0.25
    random.seed(1)

    print("== 1. detection latency at default poll intervals ==")
    for platform in ("signal", "gcp", "azure", "aws"):
        values = detection_latencies(platform, args.trials)
        print(f"{platform:>6}: {summary(values)}")

    print(f"== 2. example script (digits, --step-sleep {args.step_sleep:.2f}) ==")
    for source in ("signal", "aws"):
        runs = [example_once(source, args.step_sleep) for _ in range(args.runs)]
        report(f"example/{source}", runs, POLL_S[source])

    print(f"== 3. {args.gib:g} GiB state in-process ==")
    for source in ("signal", "aws"):
        runs = [big_state_once(source, args.gib, step_s=0.5) for _ in range(args.runs)]
        print(f"state bytes {int(runs[0]['bytes']):,}")
        report(f"big/{source}", runs, POLL_S[source])


if __name__ == "__main__":
    main()
