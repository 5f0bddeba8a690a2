"""examples/digits/infer.py killed 5 times at random, with 1 and with 3 workers (one of them
SIGKILLed while it holds a lease): the outputs end byte-identical to an uninterrupted run's,
the ledger is complete, no shard is written twice, and no shard is ever leased to a second
holder while an earlier lease on it is live."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
import yaml

from spotwise.batch import read_plan, verify_outputs
from spotwise.storage import open_storage
from spotwise.telemetry.events import read_events

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits" / "infer.py"
# 30,549 items in 31 shards keep the test quick; the example's default is >= 100,000 items
ARGS = ["--items", "30000", "--shard-size", "1000", "--lease-ttl", "1.5", "--item-sleep", "0.02"]


def _start(out: Path, events: Path, extra: list[str]) -> subprocess.Popen[str]:
    env = {**os.environ, "SPOTWISE_PLATFORM": "none"}
    return subprocess.Popen(
        [sys.executable, str(EXAMPLE), "--out", str(out), "--events", str(events), *ARGS,
         *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        start_new_session=True)  # fmt: skip


def _finish(proc: subprocess.Popen[str]) -> str:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out.strip().splitlines()[-1]


def _wait_for_new_lease(events: Path, seen: int, proc: subprocess.Popen[str]) -> list[dict]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        leases = read_events(events, "lease")
        if len(leases) > seen:
            return leases
        assert proc.poll() is None, "the run ended before it could be killed"
        time.sleep(0.05)
    raise AssertionError("no shard was leased within 60 s")


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> str:
    tmp = tmp_path_factory.mktemp("reference")
    return _finish(_start(tmp / "out", tmp / "events.jsonl", ["--workers", "1"]))


def _check_history(events: Path, shards: int) -> None:
    written: dict[int, int] = defaultdict(int)
    for e in read_events(events, "shard-written"):
        written[e["shard"]] += 1
    assert max(written.values()) == 1, f"a shard was written twice: {dict(written)}"
    until: dict[str, float] = {}  # a lease's last word: renewals extend it, a release ends it
    for e in sorted(read_events(events), key=lambda e: e["time"]):
        if "token" in e and "until" in e:
            until[e["token"]] = e["until"]
    grants: dict[int, list[dict]] = defaultdict(list)
    for e in read_events(events, "lease"):
        grants[e["shard"]].append(e)
    done = {e["token"] for e in read_events(events, "shard-written")}
    for shard, seq in grants.items():
        seq.sort(key=lambda e: e["time"])
        for earlier, later in itertools.pairwise(seq):
            assert earlier["token"] not in done, f"shard {shard} leased again after its commit"
            assert until[earlier["token"]] <= later["time"] + 0.05, (
                f"shard {shard} was leased to {later['holder']} while {earlier['holder']}'s "
                "lease was live"
            )
    assert set(grants) == set(range(shards))


def _holding(events: Path, procs: dict[str, subprocess.Popen[str]]) -> dict[str, dict]:
    """Each running worker's lease on a shard it has not written yet (waits for one)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        written = {e["token"] for e in read_events(events, "shard-written")}
        holding = {
            e["holder"]: e
            for e in read_events(events, "lease")
            if procs[e["holder"]].pid == e["pid"] and procs[e["holder"]].poll() is None
        }
        holding = {h: e for h, e in holding.items() if e["token"] not in written}
        if holding:
            return holding
        time.sleep(0.05)
    raise AssertionError("no worker held a lease within 60 s")


def _check_outputs(out: Path, events: Path, redone: bool = True) -> None:
    storage = open_storage(str(out))
    plan = read_plan(storage)
    assert verify_outputs(storage, plan) == [], "the ledger is complete and every CRC matches"
    assert len(list((out / "ledger").glob("shard-*.json"))) == plan.shards
    _check_history(events, plan.shards)
    if redone:
        assert len(read_events(events, "lease")) > plan.shards, "the kills cost leases to redo"


def test_one_worker_killed_five_times_ends_byte_identical(tmp_path, reference):
    rng = random.Random(1601)
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    seen = 0
    slow = ["--workers", "1", "--item-sleep", "0.1"]  # enough work left for five kills
    for _ in range(5):
        proc = _start(out, events, slow)
        _wait_for_new_lease(events, seen, proc)
        time.sleep(rng.uniform(0.0, 0.6))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        seen = len(read_events(events, "lease"))
    assert _finish(_start(out, events, slow)) == reference
    _check_outputs(out, events)


def test_three_workers_each_killed_while_holding_a_lease(tmp_path, reference):
    """Three workers share the shards; five times a worker that holds a lease is SIGKILLed and
    started again (as the controller relaunches a lost machine), the others carrying on."""
    rng = random.Random(1603)
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    names = [f"w{i}" for i in range(3)]
    slow = ["--item-sleep", "0.15"]  # enough work left for five kills
    procs = {n: _start(out, events, ["--worker", n, *slow]) for n in names}
    _wait_for_new_lease(events, 0, procs["w0"])
    victims = []
    for _ in range(5):
        time.sleep(rng.uniform(0.3, 0.8))
        holding = _holding(events, procs)
        victim = holding[rng.choice(sorted(holding))]
        os.killpg(procs[victim["holder"]].pid, signal.SIGKILL)
        procs[victim["holder"]].wait()
        victims.append(victim)
        procs[victim["holder"]] = _start(out, events, ["--worker", victim["holder"], *slow])
    lines = {_finish(p) for p in procs.values()}
    assert lines == {reference}
    _check_outputs(out, events)
    for victim in victims:  # the victim's shard was not lost: leased again, then written
        later = [
            e
            for e in read_events(events, "lease")
            if e["shard"] == victim["shard"] and e["time"] > victim["time"]
        ]
        assert later, f"shard {victim['shard']} was never leased again after its holder died"


def test_spotwise_infer_runs_workers_through_the_controller_across_preemptions(tmp_path, reference):
    """`spotwise infer` on the sim market: both workers start in a zone whose spot capacity
    ends after 9 s; they get the notice (exit 75 after handing back their shard, or killed while
    still starting up), are relaunched in the next zone and finish; the outputs equal the
    uninterrupted run's. (The notice path itself is tested in-process in test_batch.py.)"""
    traces = tmp_path / "traces"
    traces.mkdir()
    for zone, counts in {"zb": [1] * 9 + [0] * 1991, "zc": [1] * 2000}.items():
        (traces / f"{zone}_v100_1.json").write_text(
            json.dumps({"metadata": {"gap_seconds": 10}, "data": counts})
        )
    job = tmp_path / "infer.yaml"
    job.write_text(yaml.safe_dump({
        "name": "infer-test", "workers": 2, "output": "preds", "market": "spot",
        "command": f"python {EXAMPLE} --out $SPOTWISE_BATCH_OUT --worker $SPOTWISE_WORKER "
                   f"--events {tmp_path / 'events.jsonl'} {' '.join(ARGS)} --item-sleep 0.25",
        "provider": {"name": "sim", "trace": str(traces), "zones": ["zb", "zc"],
                     "time_compression": 10, "notice_s": 1.5, "boot_s": 0,
                     "spot_usd_per_hour": 1.0, "ondemand_usd_per_hour": 3.0},
    }))  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", "from spotwise.cli.main import main; main()", "infer", str(job)],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"last output line: {reference}" in done.stdout
    assert "31/31 shards, 30549 items" in done.stdout and "items/s" in done.stdout
    assert done.stdout.count(": SUCCEEDED (") == 2, done.stdout
    assert "SUCCEEDED (2 attempt(s))" in done.stdout, "a worker was relaunched after the notice"
    _check_outputs(tmp_path / "preds", tmp_path / "events.jsonl", redone=False)
