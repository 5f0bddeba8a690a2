"""Sharded, exactly-once batch inference that survives kills and splits work by leases.

See :func:`run_batch` and docs/batch.md.
"""

from spotwise.batch.leases import LeaseBoard, ObjectLeases, SQLiteLeases, open_leases
from spotwise.batch.plan import Plan
from spotwise.batch.runner import (
    BatchResult,
    committed_shards,
    describe,
    model_fingerprint,
    outputs_sha256,
    read_plan,
    run_batch,
    verify_outputs,
)
from spotwise.leases import Lease

__all__ = [
    "BatchResult",
    "Lease",
    "LeaseBoard",
    "ObjectLeases",
    "Plan",
    "SQLiteLeases",
    "committed_shards",
    "describe",
    "model_fingerprint",
    "open_leases",
    "outputs_sha256",
    "read_plan",
    "run_batch",
    "verify_outputs",
]
