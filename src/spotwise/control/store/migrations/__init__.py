"""Alembic migrations of the job store, run by ``spotwise.control.store.migrate`` at open."""
