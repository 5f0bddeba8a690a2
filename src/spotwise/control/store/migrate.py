"""Bring a database to this code's schema at open, with Alembic, or refuse a newer one.

A database written before migrations existed (tables, no ``alembic_version``) is stamped with
the baseline revision and upgraded in place; its rows are kept. Alembic is imported only when
there is something to do: a database already at ``HEAD`` costs one query to open.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy as sa

from spotwise.control.store.engine import Writer
from spotwise.errors import ControlError

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS = Path(__file__).with_name("migrations")
BASELINE = "0001"
HEAD = "0004"  # the newest revision under migrations/versions (a test holds the two together)
# Columns the pre-migration code added to older databases at open; adopted before stamping.
_PRE_BASELINE_COLUMNS = (("jobs", "policy_json", "TEXT"),)
# pg_advisory_xact_lock key: one migrating process per PostgreSQL database at a time.
_PG_MIGRATION_LOCK = 0x5370_6F74


def alembic_config(connection: sa.Connection | None = None) -> Config:
    """Alembic's configuration without an ini file; env.py migrates on ``connection``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def _current(connection: sa.Connection) -> str | None:
    """The database's revision; None for a database without one (new, or pre-migration)."""
    if not sa.inspect(connection).has_table("alembic_version"):
        return None
    return connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()


def ensure_schema(engine: sa.Engine, where: str) -> None:
    with engine.connect() as connection:
        if _current(connection) == HEAD:
            return
    from alembic import command
    from alembic.script import ScriptDirectory

    with Writer(engine).begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                sa.text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_MIGRATION_LOCK}
            )
        current = _current(connection)  # another process may have migrated meanwhile
        config = alembic_config(connection)
        known = {s.revision for s in ScriptDirectory.from_config(config).walk_revisions()}
        if current is not None and current not in known:
            raise ControlError(
                f"the job database {where} has schema revision {current!r}, written by a newer"
                f" spotwise than this one (which knows revisions up to {HEAD!r})",
                hint="upgrade spotwise, or point SPOTWISE_DB or SPOTWISE_HOME at another database",
            )
        if current is None and sa.inspect(connection).has_table("jobs"):
            _adopt_pre_baseline_columns(connection)
            command.stamp(config, BASELINE)
        command.upgrade(config, "head")


def _adopt_pre_baseline_columns(connection: sa.Connection) -> None:
    inspector = sa.inspect(connection)
    for table, column, declaration in _PRE_BASELINE_COLUMNS:
        if column not in {c["name"] for c in inspector.get_columns(table)}:
            connection.exec_driver_sql(f"ALTER TABLE {table} ADD COLUMN {column} {declaration}")
