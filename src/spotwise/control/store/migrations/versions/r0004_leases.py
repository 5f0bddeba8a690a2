"""Job leases for several ``spotwise server`` replicas on one database: each job's lease owner
(the replica driving it; NULL: nobody), its expiry (seconds since the epoch, the database's
clock) and its fencing token, raised by every take-over (``control/store/leases.py``).

Jobs written before this revision are held by nobody: the first replica to scan adopts them.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("lease_owner", sa.Text))
    op.add_column(
        "jobs", sa.Column("lease_expires_at", sa.Float, nullable=False, server_default="0")
    )
    op.add_column(
        "jobs", sa.Column("lease_token", sa.BigInteger, nullable=False, server_default="0")
    )
