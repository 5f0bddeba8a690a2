"""Alembic's entry point: migrate on the connection (and transaction) the store opened."""

from __future__ import annotations

from alembic import context

from spotwise.control.store.schema import metadata

context.configure(connection=context.config.attributes["connection"], target_metadata=metadata)
with context.begin_transaction():
    context.run_migrations()
