"""The tables as the code reads and writes them (the migrations build the same ones; a test
compares the two on SQLite and PostgreSQL)."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

# Event ids grow past 2**31 on a busy team database; SQLite's AUTOINCREMENT needs INTEGER.
EVENT_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

jobs = sa.Table(
    "jobs",
    metadata,
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
    sa.Column("owner", sa.Text),  # the user who submitted it (None: before users existed)
    # the server replica driving it (leases.py): owner (None: nobody), expiry (the database's
    # clock), fencing token (raised by every take-over)
    sa.Column("lease_owner", sa.Text),
    sa.Column("lease_expires_at", sa.Float, nullable=False, server_default="0"),
    sa.Column("lease_token", sa.BigInteger, nullable=False, server_default="0"),
    # a listing's pages, newest first: everyone's, one owner's; the jobs a server drives
    sa.Index("jobs_listing", "created_at", "id"),
    sa.Index("jobs_owner_listing", "owner", "created_at", "id"),
    sa.Index("jobs_state", "state"),
)

attempts = sa.Table(
    "attempts",
    metadata,
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

events = sa.Table(
    "events",
    metadata,
    sa.Column("id", EVENT_ID, primary_key=True, autoincrement=True),
    sa.Column("job_id", sa.Text, nullable=False),
    sa.Column("at", sa.Float, nullable=False),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("message", sa.Text, nullable=False),
    sa.Column("data_json", sa.Text, nullable=False, server_default="{}"),
    sa.Index("events_job", "job_id", "id"),
    sqlite_autoincrement=True,
)

users = sa.Table(
    "users",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("role", sa.Text, nullable=False),  # admin | user | viewer
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("notify_json", sa.Text),  # the user's webhooks, for all their jobs (a notify doc)
)

# A token's secret is never stored, only its SHA-256 (hex).
tokens = sa.Table(
    "tokens",
    metadata,
    sa.Column("id", sa.Text, primary_key=True),
    sa.Column("user", sa.Text, sa.ForeignKey("users.name"), nullable=False),
    sa.Column("sha256", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False, server_default=""),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float),
    sa.Column("revoked_at", sa.Float),
)
