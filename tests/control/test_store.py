"""The job store on both of its databases (SQLite and PostgreSQL, the ``store_db`` fixture)."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext

from spotwise.control.store import JobState, Store
from spotwise.control.store.schema import metadata
from spotwise.errors import ConfigError, ControlError, JobNotFoundError

pytestmark = pytest.mark.usefixtures("store_db")


def _engine(url: str) -> sa.Engine:
    return sa.create_engine(url.replace("postgresql://", "postgresql+psycopg://", 1))


def test_jobs_attempts_and_events_persist_across_connections():
    store = Store()
    job = store.create_job("demo", {"command": ["x"]}, None, now=100.0)
    a = store.open_attempt(
        job.id,
        provider="sim",
        market="spot",
        zone="z1",
        usd_per_hour=1.0,
        ondemand_usd_per_hour=3.0,
        time_scale=600.0,
        now=100.0,
    )
    store.update_job(job.id, state=JobState.RUNNING, message="go", blocked={"z2": 5.0})
    store.update_attempt(job.id, a.n, handle={"pid": 7}, running_at=101.5)
    store.close()
    again = Store()
    assert again.job(job.id).state is JobState.RUNNING
    assert again.job(job.id).blocked == {"z2": 5.0}
    assert again.job(job.id[:8]).id == job.id  # unique prefix
    [attempt] = again.attempts(job.id)
    assert (attempt.n, attempt.state, attempt.handle) == (a.n, "launching", {"pid": 7})
    assert attempt.running_at == 101.5
    # billed from launch: 6 wall seconds x 600 = 1 simulated hour
    assert attempt.cost_usd(106.0) == pytest.approx(1.0)
    assert attempt.ondemand_cost_usd(106.0) == pytest.approx(3.0)
    kinds = [e["kind"] for e in again.events(job.id)]
    assert kinds[:2] == ["created", "attempt"]


def test_never_two_open_attempts():
    store = Store()
    job = store.create_job("demo", {}, None)
    store.open_attempt(
        job.id,
        provider="local",
        market="on-demand",
        zone="",
        usd_per_hour=0,
        ondemand_usd_per_hour=0,
        time_scale=1,
    )
    with pytest.raises(ControlError, match="already has attempt 1 open"):
        store.open_attempt(
            job.id,
            provider="local",
            market="on-demand",
            zone="",
            usd_per_hour=0,
            ondemand_usd_per_hour=0,
            time_scale=1,
        )


def test_unknown_job():
    with pytest.raises(JobNotFoundError, match="spotwise jobs"):
        Store().job("nope")


def test_ids_are_matched_exactly_or_by_prefix_never_as_patterns():
    store = Store()
    victim = store.create_job("victim", {}, None)
    under = store.create_job("a_b", {}, None)
    store.create_job("axb", {}, None)
    for typed in ("%tim", "%", "_", "%_%", "vic%", "a%", "", "x" * 50_000, "victim\x00"):
        with pytest.raises(JobNotFoundError) as err:
            store.job(typed)
        assert len(str(err.value)) < 200  # a huge id is not echoed back whole
    assert store.job("vic").id == victim.id
    assert store.job(victim.id).id == victim.id
    assert store.job("a_").id == under.id  # "_" is a character, not "any character"
    with pytest.raises(JobNotFoundError, match=r"ambiguous: it starts a.b-.*, a.b-"):
        store.job("a")


def test_an_ambiguous_prefix_lists_a_bounded_number_of_candidates():
    store = Store()
    made = {store.create_job("twin", {}, None, now=float(i)).id for i in range(12)}
    with pytest.raises(JobNotFoundError, match="give more of the id") as err:
        store.job("twin")
    listed = set(str(err.value).split(": it starts ")[1].split("\n")[0].split(", "))
    assert "..." in listed and len(listed - {"..."}) == 10 and listed - {"..."} <= made


def test_the_migrated_schema_is_the_one_the_code_uses(store_db: str):
    Store()
    with _engine(store_db).connect() as db:
        assert compare_metadata(MigrationContext.configure(db), metadata) == []


def test_a_schema_written_by_a_newer_spotwise_is_refused(store_db: str):
    Store().create_job("kept", {}, None)
    engine = _engine(store_db)
    with engine.begin() as db:
        db.exec_driver_sql("UPDATE alembic_version SET version_num = 'f00dfeed'")
    with pytest.raises(ControlError, match="newer spotwise") as err:
        Store()
    shown = sa.make_url(store_db)
    assert "'f00dfeed'" in str(err.value)
    assert shown.render_as_string(hide_password=True) in str(err.value)
    assert not shown.password or shown.password not in str(err.value)
    with engine.connect() as db:  # refused, not touched
        assert db.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == "f00dfeed"
        assert db.exec_driver_sql("SELECT COUNT(*) FROM jobs").scalar() == 1


def test_stores_opened_at_once_share_one_database():
    """As several controllers and the dashboard do: each its own Store (connections) on a
    database none of them has created; each migrates or waits, creates jobs, then all race to
    open the first attempt of one job: exactly one opens it."""
    n = 4
    created: list[str] = []
    outcomes: list[str] = []
    shared: list[str] = []
    ready = threading.Barrier(n + 1)

    def racer(i: int) -> None:
        store = Store()
        created.extend(store.create_job(f"p{i}", {}, None).id for _ in range(5))
        ready.wait()
        ready.wait()  # the shared job exists now
        try:
            store.open_attempt(
                shared[0],
                provider="local",
                market="on-demand",
                zone="",
                usd_per_hour=0,
                ondemand_usd_per_hour=0,
                time_scale=1,
            )
            outcomes.append("opened")
        except ControlError as exc:
            outcomes.append(str(exc))
        store.close()

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait(timeout=120)
    store = Store()
    shared.append(store.create_job("shared", {}, None).id)
    ready.wait(timeout=120)
    for t in threads:
        t.join(timeout=120)
    assert sorted(outcomes) == [f"job {shared[0]} already has attempt 1 open"] * (n - 1) + [
        "opened"
    ]
    assert len(set(created)) == n * 5
    assert {j.id for j in store.jobs()} == {*created, *shared}
    assert [a.n for a in store.attempts(shared[0])] == [1]


def test_a_second_store_in_one_process_loses_no_commit_when_another_process_closes():
    """``spotwise launch`` opens a store to submit and another to drive the job, while
    ``spotwise jobs`` runs in other processes. Opening the second store must not drop the
    first one's SQLite locks: the next process to close the database would then delete the WAL
    that the first store still appends to, and every later commit (the launched attempt) would
    be lost, as the controller-killed AWS e2e test saw."""
    import subprocess
    import sys

    first = Store()
    job = first.create_job("wal", {}, None)
    first.event(job.id, "one", "before the second store")
    second = Store()
    peek = "from spotwise.control.store import Store; s = Store(); print(len(s.jobs())); s.close()"
    assert subprocess.run(
        [sys.executable, "-c", peek], capture_output=True, text=True, check=True
    ).stdout.split() == ["1"]
    first.event(job.id, "two", "after another process closed the database")
    read = (
        "from spotwise.control.store import Store; s = Store(); "
        f"print(' '.join(e['kind'] for e in s.events({job.id!r}))); s.close()"
    )
    kinds = subprocess.run([sys.executable, "-c", read], capture_output=True, text=True, check=True)
    assert kinds.stdout.split() == ["created", "one", "two"]
    second.close()
    first.close()


def test_a_listing_reads_each_jobs_own_attempts_placement_and_lock_in_a_few_queries():
    """``job_summaries`` (a few queries for all jobs) gives exactly each job's ``job_summary``."""
    from spotwise.control.ownership import controller_lock
    from spotwise.control.spec import parse_spec
    from spotwise.control.summary import job_summaries, job_summary

    store = Store()
    spec = parse_spec({"name": "j", "command": "true", "provider": "local"}).model_dump(mode="json")
    spot = {**spec, "market": "spot", "budget_usd": 5.0}
    idle, done, preempted, running = (
        store.create_job(name, doc, None, now=100.0)
        for name, doc in (("idle", spec), ("done", spec), ("pre", spot), ("run", spot))
    )
    prices = {"usd_per_hour": 1.0, "ondemand_usd_per_hour": 3.0, "time_scale": 1.0}
    first = store.open_attempt(done.id, provider="local", market="spot", zone="a", **prices)
    store.update_attempt(done.id, first.n, state="ended", ended_at=200.0, reason="succeeded")
    store.update_job(done.id, state=JobState.SUCCEEDED, message="done")
    for zone, reason in (("a", "preempted"), ("b", "lost"), ("c", "switched")):
        a = store.open_attempt(preempted.id, provider="sim", market="spot", zone=zone, **prices)
        store.update_attempt(preempted.id, a.n, state="ended", ended_at=150.0, reason=reason)
        store.event(preempted.id, "placement", f"zone {zone}", {"zone": zone})
    store.open_attempt(running.id, provider="sim", market="spot", zone="z", now=120.0, **prices)
    store.event(running.id, "placement", "zone z", {"zone": "z", "why": "cheapest"})
    store.update_job(running.id, state=JobState.RUNNING, policy=None)

    jobs = [*store.jobs(), done]  # (a job listed twice is summarised twice)
    with controller_lock(running):
        listed = job_summaries(store, jobs, now=300.0)
        assert listed == [job_summary(store, job, now=300.0) for job in jobs]
    by_id = {doc["id"]: doc for doc in listed}
    assert [len(by_id[j.id]["attempts"]) for j in (idle, done, preempted, running)] == [0, 1, 3, 1]
    assert (by_id[preempted.id]["preemptions"], by_id[preempted.id]["switches"]) == (2, 1)
    assert by_id[preempted.id]["placement"] == {"zone": "c"}  # the latest
    assert by_id[running.id]["placement"] == {"zone": "z", "why": "cheapest"}
    assert by_id[idle.id]["placement"] is None and by_id[done.id]["placement"] is None
    assert [by_id[j.id]["controller_alive"] for j in (idle, running)] == [False, True]
    assert by_id[running.id]["cost_usd"] == pytest.approx(180 / 3600)
    assert by_id[running.id]["budget_usd"] == 5.0
    assert job_summaries(store, [], now=300.0) == []


def test_a_new_job_whose_id_is_drawn_twice_gets_another(monkeypatch: pytest.MonkeyPatch):
    import secrets

    drawn = iter(["aaaaaa", "aaaaaa", "bbbbbb"])
    monkeypatch.setattr(secrets, "token_hex", lambda n: next(drawn))
    store = Store()
    first = store.create_job("sweep", {"command": ["x"]}, None)
    second = store.create_job("sweep", {"command": ["y"]}, None)
    assert (first.id, second.id) == ("sweep-aaaaaa", "sweep-bbbbbb")
    assert store.job(first.id).spec == {"command": ["x"]}
    assert [e["kind"] for e in store.events(second.id)] == ["created"]


def _walk(store: Store, limit: int, between=None, **filters) -> list[str]:
    """Every id of a listing, page by page (``between(page_number)`` runs between pages)."""
    ids: list[str] = []
    cursor = None
    for n in range(100):
        page, cursor = store.job_page(limit, cursor=cursor, **filters)
        ids += [j.id for j in page]
        if cursor is None:
            return ids
        if between is not None:
            between(n)
    raise AssertionError("the listing never ended")


def test_listing_pages_filter_in_the_query_and_keep_their_place():
    store = Store()
    made: dict[str | None, list[str]] = {"ann": [], "bob": [], None: []}
    for n in range(14):
        owner = ("ann", "bob", None)[n % 3]
        # every second pair shares a creation time: the id orders them
        job = store.create_job(f"j{n}", {}, None, now=1000.0 + n // 2, owner=owner)
        made[owner].append(job.id)
        if n % 4 == 0:
            store.update_job(job.id, state=JobState.FAILED)

    def newest_first(ids: list[str]) -> list[str]:
        return [
            j.id for j in sorted((store.job(i) for i in ids), key=lambda j: (j.created_at, j.id))
        ][::-1]

    # a page holds only its owner's jobs, newest first, and the walk has each once
    assert _walk(store, 2, owner="ann") == newest_first(made["ann"])
    assert _walk(store, 3) == newest_first([i for ids in made.values() for i in ids])
    failed = [j.id for j in store.jobs() if j.state is JobState.FAILED]
    assert _walk(store, 2, states=[JobState.FAILED]) == newest_first(failed)
    page, cursor = store.job_page(100, owner="nobody")
    assert (page, cursor) == ([], None)

    # jobs added and changed while a listing pages through: later pages neither repeat nor
    # skip what was there when it started
    before = _walk(store, 3)

    def meanwhile(n: int) -> None:
        store.create_job(f"new{n}", {}, None, now=5000.0 + n)
        store.update_job(before[-1], state=JobState.CANCELLED)

    assert _walk(store, 3, between=meanwhile) == before

    with pytest.raises(ConfigError, match="cursor 'nonsense' is not one a listing gave"):
        store.job_page(3, cursor="nonsense")
