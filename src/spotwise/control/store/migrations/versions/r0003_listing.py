"""Indexes for paged listings (newest first, everyone's or one owner's) and for the jobs a server
drives (those not ended): a listing of a page, or a server's search for unfinished jobs, reads
only what it returns, however many jobs the store holds. ``jobs_owner`` is subsumed by the
owner's listing index.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("jobs_listing", "jobs", ["created_at", "id"])
    op.create_index("jobs_owner_listing", "jobs", ["owner", "created_at", "id"])
    op.create_index("jobs_state", "jobs", ["state"])
    op.drop_index("jobs_owner", table_name="jobs")
