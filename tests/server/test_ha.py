"""Two `spotwise server` replicas on one PostgreSQL: the one driving 20 jobs stalls or is
SIGKILLed, the other adopts all 20 within the lease time (plus one scan), every job ends
SUCCEEDED, and no attempt is launched twice (each attempt's machine started once, each launch
recorded once under a lease)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotwise.control.launching import attempts_dir
from spotwise.control.providers.base import Phase
from spotwise.control.providers.process import ProcessMachines
from spotwise.control.store import JobState, Store
from spotwise.control.store.engine import IDLE_IN_TRANSACTION_S
from spotwise.control.store.leases import RENEWALS_PER_LEASE

from .conftest import Server, wait_until

JOBS = 20
LEASE_S = 5.0  # short, yet renewed (every 1.7 s) in time on a loaded runner
SCAN_S = LEASE_S / RENEWALS_PER_LEASE  # the driver scans at least this often
# Adopting 20 jobs on a loaded 2-core runner: the acquisitions are quick, but the new owner's
# pool is busy starting controllers; this is the allowance beyond the lease and one scan.
ADOPTION_SLACK_S = 10.0
REPLICA = re.compile(r"spotwise server on (http://\S+?)/ .* as replica (\S+) ")
BANNER = re.compile(r"\[spotwise\] attempt (\d+) on sim ")
# Waits for `go`, then: the first attempt exits 75 (as after a save: relaunched), the second 0.
SCRIPT = (
    'trap "exit 75" TERM; while [ ! -e "$GO" ]; do sleep 0.3; done; '
    'if [ -e "$SPOTWISE_CHECKPOINT_DIR/once" ]; then exit 0; fi; '
    'mkdir -p "$SPOTWISE_CHECKPOINT_DIR"; touch "$SPOTWISE_CHECKPOINT_DIR/once"; exit 75'
)


def _replica() -> tuple[Server, str]:
    """A real ``spotwise server`` process on the test's database and home: its URL and the
    replica id it drives jobs as."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "spotwise", "server", "--port", "0", "--lease", f"{LEASE_S:g}s"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    found = REPLICA.search(line)
    if found is None:
        proc.kill()
        pytest.fail(f"the server did not start: {line!r}")
    return Server(proc, found.group(1)), found.group(2)


def _job(n: int, traces: Path, workdir: Path, go: Path) -> bytes:
    return json.dumps(
        {
            "name": f"ha{n}",
            "command": ["sh", "-c", SCRIPT],
            "workdir": str(workdir),
            "market": "spot",
            "restart_backoff": 0,
            "env": {"GO": str(go)},
            "provider": {
                "name": "sim",
                "trace": str(traces),
                "zones": ["za", "zb"],
                "time_compression": 1,
                "boot_s": 0,
                "notice_s": 1,
                "spot_usd_per_hour": 1.0,
                "ondemand_usd_per_hour": 3.0,
            },
        }
    ).encode()


@pytest.fixture()
def machines_end(store_db: str) -> Iterator[None]:
    """Whatever the test's outcome, none of its sim machines outlives it (their scripts wait
    for ``go`` forever): after the test has stopped its servers, every machine still up in a
    job's attempt directories is stopped the sim provider's way and waited for."""
    yield
    machines = ProcessMachines(settle_s=1.0)
    store = Store()
    try:
        handles = [h for job in store.jobs() for h in machines.find(attempts_dir(job.dir))]
    finally:
        store.close()
    for handle in handles:
        machines.terminate(handle)
    up = (Phase.STARTING, Phase.RUNNING)
    wait_until(lambda: not any(machines.status(h).phase in up for h in handles), 60)


def _driving(server: Server) -> int:
    return int(server.call("GET", "/healthz", None).json()["driving"])


@pytest.mark.parametrize("store_db", ["postgres"], indirect=True)  # SQLite: one replica
def test_a_killed_replicas_jobs_are_adopted_by_the_other_and_none_launched_twice(
    store_db, machines_end, tmp_path: Path
):
    """a drives the 20 jobs and stalls (SIGSTOP): b takes them over; a, woken, drops them all.
    Then b, now driving them, is SIGKILLed: a adopts them back within the lease time, and
    finishes them, relaunching each once."""
    traces, workdir, go = tmp_path / "traces", tmp_path / "code", tmp_path / "go"
    traces.mkdir()
    workdir.mkdir()
    (workdir / "README").write_text("the jobs' code: their command is inline\n")
    for zone in ("za", "zb"):
        (traces / f"{zone}_v100_1.json").write_text(
            json.dumps({"metadata": {"gap_seconds": 10}, "data": [1] * 1000})
        )
    store = Store()
    servers: list[Server] = []
    try:
        a, a_id = _replica()
        servers.append(a)
        token = (store.home / "admin-token").read_text().strip()
        ids = []
        for n in range(JOBS):
            answer = a.call("POST", "/api/v1/jobs", token, _job(n, traces, workdir, go))
            assert answer.status == 201, answer.body
            ids.append(answer.json()["id"])

        def owned_by(replica: str) -> bool:
            return all(store.job(i).lease_owner == replica for i in ids)

        wait_until(
            lambda: owned_by(a_id) and all(store.job(i).state is JobState.RUNNING for i in ids),
            120,
        )
        b, b_id = _replica()
        servers.append(b)
        assert _driving(b) == 0  # all are leased

        def taken_over(by: str) -> float:
            since = time.time()
            wait_until(lambda: owned_by(by), 60)
            return time.time() - since

        a.proc.send_signal(signal.SIGSTOP)
        stalled_s = taken_over(b_id)
        a.proc.send_signal(signal.SIGCONT)
        wait_until(lambda: _driving(a) == 0, 30)  # woken: it learns at its renewal, drops all

        b.kill()
        killed_s = taken_over(a_id)
        print(f"{JOBS} jobs taken over {stalled_s:.1f}s after a stall, {killed_s:.1f}s after")
        print(f"a kill (lease {LEASE_S:g}s)")
        assert killed_s <= LEASE_S + SCAN_S + ADOPTION_SLACK_S
        # (a replica frozen inside a transaction holds its row locks until PostgreSQL ends it)
        assert stalled_s <= LEASE_S + SCAN_S + IDLE_IN_TRANSACTION_S + ADOPTION_SLACK_S
        for i in ids:  # every machine still has its owner: the open attempt, a's again
            [attempt] = store.attempts(i)
            assert attempt.state == "running" and attempt.handle is not None
            assert store.job(i).lease_token == 3  # a's, b's, a's

        go.touch()
        wait_until(lambda: all(store.job(i).state.terminal for i in ids), 120)
        for i in ids:
            job = store.job(i)
            assert job.state is JobState.SUCCEEDED, job.message
            assert [(t.n, t.reason) for t in store.attempts(i)] == [
                (1, "preempted"),
                (2, "succeeded"),
            ]
            starts = Counter(BANNER.findall(job.log_path.read_text()))
            assert starts == {"1": 1, "2": 1}, starts  # each machine started once
            launches = [e["data"]["n"] for e in store.events(i) if e["kind"] == "launch"]
            assert launches == [1, 2]  # each launch recorded once, under a lease
        wait_until(lambda: _driving(a) == 0)  # and each job let go at its end
    finally:
        for s in servers:
            if s.proc.poll() is None:
                s.proc.send_signal(signal.SIGCONT)
            s.stop()
