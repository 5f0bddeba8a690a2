"""A worker group's controllers run in one process: they share one job store, so a large sweep
or batch job holds the store's bounded pool of database connections, not one per worker."""

from __future__ import annotations

import secrets
from pathlib import Path

import sqlalchemy as sa

from spotwise.control.store import JobState, Store
from spotwise.control.store.engine import POOL_OVERFLOW, POOL_SIZE
from spotwise.control.workers import Group, load_group_file, run_group, submit_group

WORKERS = POOL_SIZE + POOL_OVERFLOW + 8  # more than one store may ever connect with


def test_a_groups_controllers_share_the_stores_bounded_connections(
    store_db: str, tmp_path: Path, monkeypatch
) -> None:
    counted = None
    if store_db.startswith("postgresql"):  # this test's own connections, by their name
        name = f"spotwise-group-{secrets.token_hex(4)}"
        url = sa.make_url(store_db).update_query_dict({"application_name": name})
        monkeypatch.setenv("SPOTWISE_DB", url.render_as_string(hide_password=False))
        counted = sa.create_engine(
            url.set(drivername="postgresql+psycopg").update_query_dict({"application_name": ""}),
            poolclass=sa.NullPool,
        )
    spec = tmp_path / "group.yaml"
    spec.write_text(f"name: g\nworkers: {WORKERS}\ncommand: sleep 2\n")
    store = Store()
    group = submit_group(store, "sweep", load_group_file(spec, "sweep", {}), {})
    store.close()
    seen: list[int] = []

    def sample(_group: Group, _store: Store) -> None:
        if counted is not None:
            with counted.connect() as db:
                query = "select count(*) from pg_stat_activity where application_name = :name"
                seen.append(db.execute(sa.text(query), {"name": name}).scalar_one())

    states = run_group(group, poll_s=0.1, on_update=sample)
    assert list(states.values()) == [JobState.SUCCEEDED] * WORKERS
    if counted is not None:
        counted.dispose()
        assert len(seen) >= 5 and 1 <= max(seen) <= POOL_SIZE + POOL_OVERFLOW, seen
