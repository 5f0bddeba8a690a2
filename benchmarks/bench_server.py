"""One ``spotwise server`` process driving N concurrent jobs on the ``sim`` provider.

Each job's command is a shell script that traps the notice and exits 75 (so what is measured
is the server, not N Python interpreters; the sim's machine supervisors, one small process per
attempt, sleep until their command ends or a signal comes). Each job starts in zone ``za``, which
loses its spot capacity ``--preempt-after`` wall seconds after the job was created: the machine
gets its notice, exits 75, and the server relaunches the job in ``zb``. ``--stored`` finished
jobs are in the store from the start (a team's history). Prints

- ``server-mib-per-job``: the server's RSS growth from 1 running job to N, per job (target <= 5);
- ``server-reaction-p99-s``: from a machine's end to the server's next launch of its job
  (the relaunch's attempt record), 99th percentile (target <= 2);
- ``api-jobs-p99-ms``: ``GET /api/v1/jobs`` (its first page, the API's default size) with
  ``--stored`` finished jobs added to the store (target <= 200); also the time to walk every
  page of the listing (``api-jobs-walk-s``);
- ``server-cpu-ms-per-job``: the server's CPU time from the second submission to the last
  relaunch, per job (what its machine's load does not inflate);
- ``server-cpu-steady-pct``: the server's CPU use (% of one core) while every job runs, after
  the relaunches (what the jobs cost it between their machines' ends);
- ``server-imports-torch``: whether the server process has torch loaded;
- ``load-average``: the machine's 1-minute load average at the start and at the end (a shared
  machine's figures depend on it).

The store is SQLite in a temporary SPOTWISE_HOME, or ``SPOTWISE_DB`` when set (PostgreSQL).
``--jobs 0`` measures the listing alone (no sim jobs run). ``--profile FILE`` writes the
server's cProfile statistics, every thread's (the driver's ticks), to FILE (``pstats``), in
CPU seconds (each thread's own: waits for locks, the database or the disk count nothing).

    .venv/bin/python benchmarks/bench_server.py --jobs 50 --stored 1000
    .venv/bin/python benchmarks/bench_server.py --jobs 0 --stored 10000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

os.environ.setdefault("SPOTWISE_PLATFORM", "none")

# the server, with one bearer token (the benchmark's own stand-in for users and tokens)
# (with BENCH_PROFILE, every thread runs under its own cProfile, merged into that file on
# SIGUSR1: uvicorn ends the process by re-raising SIGTERM, past any `finally`)
SERVER = """
import cProfile, os, pstats, signal, sys, threading, time
from spotwise.server.principal import Principal
from spotwise.server.serve import serve

TOKEN = os.environ.pop("BENCH_TOKEN")
PROFILE = os.environ.get("BENCH_PROFILE")
profiles = []

def profile_thread(*_):
    sys.setprofile(None)  # (this thread's hook only: every later thread is profiled too)
    profiles.append(cProfile.Profile(time.thread_time))  # (CPU time, not wall: threads wait)
    profiles[-1].enable()

def dump(*_):
    for p in profiles:
        p.disable()
    pstats.Stats(*profiles).dump_stats(PROFILE + ".part")
    os.replace(PROFILE + ".part", PROFILE)

if PROFILE:
    threading.setprofile(profile_thread)
    profile_thread()
    signal.signal(signal.SIGUSR1, dump)

def authenticate(request):
    if request.headers.get("authorization") == f"Bearer {TOKEN}":
        return Principal("bench", "admin")
    return None

serve(host="127.0.0.1", port=0, authenticate=authenticate)
"""
URL = re.compile(r"spotwise server on (http://\S+?)/ ")
TICK_S = 10.0  # trace seconds per tick (1 wall second = 1 trace second)


def _job(traces: Path, workdir: Path, n: int) -> bytes:
    # (`wait` returns as the notice arrives: the trap runs at once, and nothing polls)
    script = 'trap "exit 75" TERM; sleep 86400 & wait'
    doc = {
        "name": f"bench{n}",
        "command": ["sh", "-c", script],
        "workdir": str(workdir),
        "market": "spot",
        "restart_backoff": 0,
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
    return json.dumps(doc).encode()


class Client:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token

    def call(self, method: str, path: str, body: bytes | None = None) -> Any:
        return self._open(method, path, body)[0]

    def page(self, path: str) -> tuple[list[Any], str]:
        """A listing's page and the path of the next ('' after the last)."""
        listed, link = self._open("GET", path, None)
        found = re.match(r"<([^>]*)>", link or "")
        return listed, found.group(1) if found else ""

    def _open(self, method: str, path: str, body: bytes | None) -> tuple[Any, str | None]:
        request = urllib.request.Request(
            self.url + path, body, {"Authorization": f"Bearer {self.token}"}, method=method
        )
        with urllib.request.urlopen(request, timeout=600) as r:
            return json.loads(r.read()), r.headers.get("Link")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def available_mib() -> float:
    """The machine's memory available to new processes (``MemAvailable``)."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable")


def cpu_s(pid: int) -> float:
    """CPU seconds the process has used (user and system, ``/proc/PID/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_until(pred: Any, timeout_s: float, what: str) -> None:
    deadline = time.time() + timeout_s
    while not pred():
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(2.0)


def p99(values: list[float]) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[98]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000, help="concurrent sim jobs (0: none)")
    parser.add_argument("--stored", type=int, default=10_000, help="finished jobs when listing")
    parser.add_argument("--listings", type=int, default=20, help="GET /api/v1/jobs timed")
    parser.add_argument("--preempt-after", type=float, default=60.0, help="wall s in zone za")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up after (s)")
    parser.add_argument("--profile", type=Path, help="write the server's cProfile stats here")
    parser.add_argument("--steady-s", type=float, default=30.0, help="CPU measured this long")
    parser.add_argument(
        "--min-free-mib",
        type=float,
        default=2048.0,
        help="stop (cancelling every job) when the machine has less memory available: each sim"
        " job runs a machine (a shell, its timer, the job's command): the machine may be shared",
    )
    args = parser.parse_args()
    print(f"load-average: {os.getloadavg()[0]:.1f} at the start", flush=True)

    home = Path(tempfile.mkdtemp(prefix="bench-server-"))
    os.environ["SPOTWISE_HOME"] = str(home)
    traces = home / "traces"
    traces.mkdir()
    za_ticks = max(1, int(args.preempt_after // TICK_S))
    for zone, data in (("za", [1] * za_ticks + [0] * 1000), ("zb", [1] * 1000)):
        (traces / f"{zone}_v100_1.json").write_text(
            json.dumps({"metadata": {"gap_seconds": TICK_S}, "data": data})
        )
    try:
        with _database():
            _run(args, home, traces)
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def _database() -> Iterator[None]:
    """On PostgreSQL, a schema of its own for this run (dropped after): the figures are this
    run's store's, never a previous run's leftovers."""
    import sqlalchemy as sa

    raw = os.environ.get("SPOTWISE_DB", "")
    if not raw.startswith("postgresql"):
        yield
        return
    base = sa.make_url(raw)
    schema = f"bench_{secrets.token_hex(6)}"
    admin = sa.create_engine(base.set(drivername="postgresql+psycopg"), poolclass=sa.NullPool)
    with admin.begin() as db:
        db.exec_driver_sql(f"CREATE SCHEMA {schema}")
    url = base.update_query_dict({"options": f"-csearch_path={schema}"})
    os.environ["SPOTWISE_DB"] = url.render_as_string(hide_password=False)
    try:
        yield
    finally:
        os.environ["SPOTWISE_DB"] = raw
        with admin.begin() as db:
            db.exec_driver_sql(f"DROP SCHEMA {schema} CASCADE")
        admin.dispose()


def _run(args: argparse.Namespace, home: Path, traces: Path) -> None:
    from spotwise.control.store import Store

    store = Store()
    store.accounts.add_user("bench", "admin")  # the owner of the jobs the benchmark submits
    started = time.time()
    _store_finished(args.stored)  # (before the server starts: none is adopted half-made)
    print(f"stored {args.stored} finished jobs in {time.time() - started:.1f}s", flush=True)
    token = secrets.token_urlsafe(24)
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        stdout=subprocess.PIPE,
        text=True,
        env={
            **os.environ,
            "BENCH_TOKEN": token,
            "PYTHONUNBUFFERED": "1",
            **({"BENCH_PROFILE": str(args.profile.resolve())} if args.profile else {}),
        },
    )
    assert server.stdout is not None
    found = URL.search(server.stdout.readline())
    if found is None:
        raise SystemExit("the server did not start")
    api = Client(found.group(1), token)
    try:
        _measure(api, server.pid, store, traces, home, args)
    finally:  # cancel every job (their machines stop), then the server
        try:
            for job in store.jobs():
                if not job.state.terminal:
                    api.call("POST", f"/api/v1/jobs/{job.id}/cancel")
            wait_until(lambda: all(j.state.terminal for j in store.jobs()), 600, "every job to end")
            if args.profile:
                args.profile.unlink(missing_ok=True)
                server.send_signal(signal.SIGUSR1)
                wait_until(args.profile.exists, 120, "the server's profile")
                print(f"server-profile: {args.profile}")
        finally:  # (even when the jobs did not all end in time: no server or machine is left)
            server.send_signal(signal.SIGTERM)
            server.wait(120)
            _end_machines(store)
        print(f"load-average: {os.getloadavg()[0]:.1f} at the end", flush=True)


def _end_machines(store: Any) -> None:
    """Stop the sim machines a job still has (the server gives its jobs back as it stops,
    their machines running on): each job's command would otherwise sleep for a day."""
    from spotwise.control.launching import attempts_dir
    from spotwise.control.providers.process import ProcessMachines

    machines = ProcessMachines(settle_s=1.0)
    for job in store.jobs():
        if job.name != "done":  # (the stored history has no machines)
            for handle in machines.find(attempts_dir(job.dir)):
                machines.terminate(handle)


def _measure(
    api: Client, pid: int, store: Any, traces: Path, home: Path, args: argparse.Namespace
) -> None:
    """(progress is watched in the store, not through the server's API)"""
    if args.jobs > 0:
        _drive(api, pid, store, traces, home, args)
    timings = []
    cpu = cpu_s(pid)
    for _ in range(args.listings):
        t0 = time.perf_counter()
        listed = api.call("GET", "/api/v1/jobs")
        timings.append((time.perf_counter() - t0) * 1000)
    cpu_ms = (cpu_s(pid) - cpu) * 1000 / args.listings
    median = statistics.median(timings)
    print(f"api-jobs-p99-ms: {p99(timings):.1f} (median {median:.1f}; {len(listed)} jobs a page)")
    # (what a listing costs the server, whatever else the machine runs meanwhile)
    print(f"api-jobs-server-cpu-ms: {cpu_ms:.1f} a listing")
    t0, walked, path = time.perf_counter(), 0, "/api/v1/jobs?limit=1000"
    while path:
        page, link = api.page(path)
        walked += len(page)
        path = link
    print(f"api-jobs-walk-s: {time.perf_counter() - t0:.2f} (every page of 1000: {walked} jobs)")
    maps = Path(f"/proc/{pid}/maps").read_text()
    print(f"server-imports-torch: {'libtorch' in maps}")


def _drive(
    api: Client, pid: int, store: Any, traces: Path, home: Path, args: argparse.Namespace
) -> None:
    """N sim jobs driven at once, each preempted and relaunched: memory and reaction time."""

    driven: list[str] = []  # the ids of the jobs submitted (not the stored history)

    def attempts() -> list[list[Any]]:
        # (the driven jobs' attempts, a few queries: reading every job of the store, 11,000
        # with their specs, every 2 s took a good part of a core from the server measured)
        return list(store.attempts_by_job(driven).values())

    def running() -> int:  # (or already relaunched)
        return sum(bool(a) and (a[-1].state == "running" or len(a) > 1) for a in attempts())

    workdir = home / "workdir"  # what each job's workdir packs: one small file
    workdir.mkdir()
    (workdir / "README").write_text("the benchmark's jobs run a shell script\n")
    driven.append(api.call("POST", "/api/v1/jobs", _job(traces, workdir, 0))["id"])
    wait_until(lambda: running() == 1, args.timeout, "the first job to run")
    time.sleep(2)
    one = rss_mib(pid)
    started, cpu_start = time.time(), cpu_s(pid)
    for n in range(1, args.jobs):
        driven.append(api.call("POST", "/api/v1/jobs", _job(traces, workdir, n))["id"])
        if n % 20 == 0 and available_mib() < args.min_free_mib:
            raise SystemExit(
                f"stopped at {n + 1} of {args.jobs} jobs: {available_mib():.0f} MiB of memory"
                f" left (--min-free-mib {args.min_free_mib:g})"
            )
    print(f"submitted {args.jobs} jobs in {time.time() - started:.1f}s", flush=True)
    wait_until(lambda: running() == args.jobs, args.timeout, "every job to run")
    many = rss_mib(pid)
    print(f"server-rss-mib: {one:.1f} with 1 job, {many:.1f} with {args.jobs}")
    if args.jobs > 1:
        print(f"server-mib-per-job: {(many - one) / (args.jobs - 1):.3f}", flush=True)

    def settled(a: list[Any]) -> bool:  # relaunched, or started in zb (za gone by its launch)
        return len(a) > 1 or (bool(a) and a[0].zone != "za")

    wait_until(
        lambda: all(settled(a) for a in attempts()),
        args.timeout + args.preempt_after,
        "every relaunch",
    )
    # (whatever the load, what submitting, launching, preempting and relaunching a job cost)
    cpu_ms = (cpu_s(pid) - cpu_start) * 1000 / max(1, args.jobs - 1)
    print(f"server-cpu-ms-per-job: {cpu_ms:.0f} (submitted, launched, preempted, relaunched)")
    # what N running jobs cost the server between their machines' ends (their periodic ticks,
    # lease renewals, scans): CPU time, whatever else the machine runs meanwhile
    cpu, t0 = cpu_s(pid), time.time()
    time.sleep(args.steady_s)
    share = (cpu_s(pid) - cpu) / (time.time() - t0) * 100
    print(f"server-cpu-steady-pct: {share:.1f} of one core with {args.jobs} jobs running")
    reactions = []
    for first, second, *_ in (a for a in attempts() if len(a) > 1):
        # (lost: the machine was taken before the script's exit 75 was seen; an end all the same)
        assert first.reason in ("preempted", "lost") and first.ended_at is not None, first
        reactions.append(second.started_at - first.ended_at)
    median = statistics.median(reactions)
    print(
        f"server-reaction-p99-s: {p99(reactions):.3f} (median {median:.3f}; "
        f"{len(reactions)} of {args.jobs} jobs preempted and relaunched)",
        flush=True,
    )


def _store_finished(count: int) -> None:
    """``count`` finished jobs, with the rows the store writes for them (a created job, every
    fourth preempted once and relaunched elsewhere, its placements recorded), inserted a few
    thousand a statement: the listing is what is measured, and 10,000 jobs written one store
    transaction at a time take longer than the run on a shared machine."""
    import sqlalchemy as sa

    from spotwise.control.spec import parse_spec
    from spotwise.control.store import spotwise_home
    from spotwise.control.store.engine import database_url, open_engine
    from spotwise.control.store.schema import attempts, events, jobs

    spec = json.dumps(
        parse_spec({"name": "done", "command": "true", "provider": "local"}).model_dump(mode="json")
    )
    now = time.time() - count  # one a second, in the past: the newest jobs are the driven ones
    job_rows, attempt_rows, event_rows = [], [], []
    for n in range(count):
        job_id, at = f"done-{n:06x}", now + n
        job_rows.append(
            {
                "id": job_id,
                "name": "done",
                "spec_json": spec,
                "spec_path": None,
                "state": "SUCCEEDED",
                "created_at": at,
                "updated_at": at + 1,
                "message": "stored by the benchmark",
                "owner": "bench",
            }
        )
        event_rows.append(
            {"job_id": job_id, "at": at, "kind": "created", "message": "created", "data_json": "{}"}
        )
        if n % 4 == 0:
            for k, (zone, reason) in enumerate((("za", "preempted"), ("zb", "succeeded")), 1):
                attempt_rows.append(
                    {
                        "job_id": job_id,
                        "n": k,
                        "state": "ended",
                        "provider": "sim",
                        "market": "spot",
                        "zone": zone,
                        "handle_json": None,
                        "started_at": at,
                        "running_at": at,
                        "ended_at": at + 0.5,
                        "reason": reason,
                        "exit_code": 0,
                        "usd_per_hour": 1.0,
                        "ondemand_usd_per_hour": 3.0,
                        "time_scale": 1.0,
                    }
                )
                event_rows.append(
                    {
                        "job_id": job_id,
                        "at": at,
                        "kind": "placement",
                        "message": f"zone {zone}",
                        "data_json": json.dumps({"zone": zone}),
                    }
                )
    engine = open_engine(database_url(spotwise_home()))
    with engine.begin() as db:
        for table, rows in ((jobs, job_rows), (attempts, attempt_rows), (events, event_rows)):
            for start in range(0, len(rows), 2000):
                db.execute(sa.insert(table), rows[start : start + 2000])
    engine.dispose()


if __name__ == "__main__":
    main()
