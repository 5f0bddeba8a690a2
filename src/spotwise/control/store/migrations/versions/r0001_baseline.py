"""Baseline: the schema of the store before migrations (spotwise 0.1, commit d2ea188).

A database written then has these tables and no ``alembic_version``; it is stamped with this
revision at open instead of being created again.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.Text, primary_key=True),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("spec_json", sa.Text, nullable=False),
        sa.Column("spec_path", sa.Text),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("cancel_requested", sa.Integer, nullable=False, server_default="0"),
        sa.Column("next_launch_at", sa.Float, nullable=False, server_default="0"),
        sa.Column("errors_used", sa.Integer, nullable=False, server_default="0"),
        sa.Column("message", sa.Text, nullable=False, server_default=""),
        sa.Column("blocked_json", sa.Text, nullable=False, server_default="{}"),
        sa.Column("control_error_since", sa.Float),
        sa.Column("stop_reason", sa.Text, nullable=False, server_default=""),
        sa.Column("policy_json", sa.Text),
    )
    op.create_table(
        "attempts",
        sa.Column("job_id", sa.Text, sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("n", sa.Integer, primary_key=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("provider", sa.Text, nullable=False),
        sa.Column("market", sa.Text, nullable=False),
        sa.Column("zone", sa.Text, nullable=False),
        sa.Column("handle_json", sa.Text),
        sa.Column("started_at", sa.Float, nullable=False),
        sa.Column("running_at", sa.Float),
        sa.Column("ended_at", sa.Float),
        sa.Column("reason", sa.Text),
        sa.Column("exit_code", sa.Integer),
        sa.Column("usd_per_hour", sa.Float, nullable=False, server_default="0"),
        sa.Column("ondemand_usd_per_hour", sa.Float, nullable=False, server_default="0"),
        sa.Column("time_scale", sa.Float, nullable=False, server_default="1"),
    )
    op.create_table(
        "events",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            primary_key=True,
            autoincrement=True,
        ),
        sa.Column("job_id", sa.Text, nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("data_json", sa.Text, nullable=False, server_default="{}"),
        sqlite_autoincrement=True,
    )
    op.create_index("events_job", "events", ["job_id", "id"])
