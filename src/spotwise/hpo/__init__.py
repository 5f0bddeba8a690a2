"""Optuna studies whose trials resume from their checkpoints instead of restarting.

See :func:`open_study`, :func:`run_worker` and docs/hpo.md. Needs ``pip install 'spotwise[hpo]'``.
"""

from spotwise.hpo.claims import TrialLeases
from spotwise.hpo.study import (
    ATTEMPTS_ATTR,
    WorkerResult,
    open_study,
    run_worker,
    storage_for,
    study_sha256,
    trial_rows,
)

__all__ = [
    "ATTEMPTS_ATTR",
    "TrialLeases",
    "WorkerResult",
    "open_study",
    "run_worker",
    "storage_for",
    "study_sha256",
    "trial_rows",
]
