"""examples/digits/infer.py killed 5 times at random, with 1 and with 3 workers (one of them
SIGKILLed while it holds a lease): the outputs end byte-identical to an uninterrupted run's,
the ledger is complete, no shard is written twice, and no shard is ever leased to a second
holder while an earlier lease on it is live."""

from __future__ import annotations

import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

from spotwise.batch import read_plan, verify_outputs
from spotwise.storage import open_storage
from spotwise.telemetry.events import read_events

pytestmark = pytest.mark.e2e

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "digits" / "infer.py"
ARGS = ["--shard-size", "2000", "--lease-ttl", "1.5", "--item-sleep", "0.01"]


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
    until: dict[str, float] = {}
    for e in read_events(events):
        if "token" in e and "until" in e:
            until[e["token"]] = max(until.get(e["token"], 0.0), e["until"])
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


def _check_outputs(out: Path, events: Path) -> None:
    storage = open_storage(str(out))
    plan = read_plan(storage)
    assert verify_outputs(storage, plan) == [], "the ledger is complete and every CRC matches"
    assert len(list((out / "ledger").iterdir())) == plan.shards
    _check_history(events, plan.shards)
    assert len(read_events(events, "lease")) > plan.shards, "the kills cost leases to redo"


def test_one_worker_killed_five_times_ends_byte_identical(tmp_path, reference):
    rng = random.Random(1601)
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    seen = 0
    for _ in range(5):
        proc = _start(out, events, ["--workers", "1"])
        _wait_for_new_lease(events, seen, proc)
        time.sleep(rng.uniform(0.0, 0.6))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        seen = len(read_events(events, "lease"))
    assert _finish(_start(out, events, ["--workers", "1"])) == reference
    _check_outputs(out, events)


def test_three_workers_each_killed_while_holding_a_lease(tmp_path, reference):
    """Three workers share the shards; five times a worker that holds a lease is SIGKILLed and
    started again (as the controller relaunches a lost machine), the others carrying on."""
    rng = random.Random(1603)
    out, events = tmp_path / "out", tmp_path / "events.jsonl"
    names = [f"w{i}" for i in range(3)]
    slow = ["--item-sleep", "0.06"]  # enough work left for five kills
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
