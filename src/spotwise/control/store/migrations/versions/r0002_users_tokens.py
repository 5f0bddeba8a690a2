"""Users (with their own webhooks) and API tokens of ``spotwise server``, and each job's owner.

A token's secret is never stored: only its SHA-256, so a copy of the database lets nobody in.
Jobs written before this revision have no owner (``NULL``): only admins and viewers see them.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("role", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("notify_json", sa.Text),
    )
    op.create_table(
        "tokens",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("user", sa.Text, sa.ForeignKey("users.name"), nullable=False),
        sa.Column("sha256", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False, server_default=""),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float),
        sa.Column("revoked_at", sa.Float),
    )
    op.add_column("jobs", sa.Column("owner", sa.Text))
    op.create_index("jobs_owner", "jobs", ["owner"])
