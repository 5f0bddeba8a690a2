"""Optuna studies whose trials resume instead of restarting.

    from spotwise.hpo import open_study, run_worker
    study = open_study("sqlite:///sweep.db", "digits", "maximize", space, trials=8, seed=0)
    run_worker(objective, study, "sqlite:///sweep.db", run_root="runs/sweep", trials=8)

``objective(trial, run_dir)`` trains with ``spotwise.Run(run_dir, ...)``: every trial has its own
run directory (``<run_root>/trial-00003``, local or ``s3://``), so a trial whose worker was
preempted is continued from its checkpoint by whichever worker takes over its lease (see
:mod:`spotwise.hpo.claims`), with the same trial number, parameters and intermediate values.
A notice ends the worker with exit code 75 (the Run saved); the lease is handed back at once.

With ``trials`` and ``seed``, the study is created with its trials' parameters drawn up front
by a seeded sampler and enqueued (numbers 0..trials-1), so a study's result does not depend on
which worker ran what, or on how often workers were interrupted. Without ``seed`` the study's
own sampler proposes parameters as trials start (adaptive, e.g. TPE; then the order matters).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from spotwise import settings
from spotwise.errors import ConfigError, PlanMismatchError
from spotwise.hpo.claims import CREATING, TrialLeases
from spotwise.registry import require

log = logging.getLogger(__name__)

SPACE_ATTR = "spotwise.space"
READY_ATTR = "spotwise.ready"
ATTEMPTS_ATTR = "spotwise.attempts"
Objective = Callable[[Any, str], float]


def _optuna() -> Any:
    return require("optuna", "hpo", "hyperparameter sweeps")


def storage_for(url: str) -> Any:
    """Optuna's RDB storage at ``url`` (a SQLAlchemy URL); unreachable -> a clear error."""
    optuna = _optuna()
    if "://" not in url:
        raise ConfigError(
            f"study storage {url!r} is not a database URL",
            hint="use sqlite:///path/sweep.db or postgresql://user@host/db",
        )
    try:
        return optuna.storages.RDBStorage(url, engine_kwargs={"pool_pre_ping": True})
    except Exception as exc:  # SQLAlchemy/driver errors: translated at the edge
        raise ConfigError(f"cannot reach the study storage {url}: {exc.__class__.__name__}: "
                          f"{str(exc).splitlines()[0]}",
                          hint="check the URL, that the database server is up and that the "
                          "directory of a SQLite file exists") from exc  # fmt: skip


def _space_json(space: Mapping[str, Any]) -> dict[str, str]:
    optuna = _optuna()
    return {k: optuna.distributions.distribution_to_json(v) for k, v in sorted(space.items())}


def open_study(
    url: str,
    name: str,
    direction: str,
    space: Mapping[str, Any],
    *,
    trials: int | None = None,
    seed: int | None = None,
    sampler: Any = None,
    pruner: Any = None,
    wait_s: float = 60.0,
) -> Any:
    """Create the study (enqueueing ``trials`` seeded parameter sets when ``seed`` is given) or
    load it and check it is the same study: same direction, same search space."""
    optuna = _optuna()
    storage = storage_for(url)
    try:
        study = optuna.create_study(
            storage=storage, study_name=name, direction=direction, sampler=sampler, pruner=pruner
        )
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
        _check_same(study, url, direction, space)
        _wait_ready(study, wait_s)
        return study
    study.set_user_attr(SPACE_ATTR, _space_json(space))
    if seed is not None:
        if not trials:
            raise ConfigError("a seeded study needs trials=N (how many to draw up front)")
        draw = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        for _ in range(trials):
            params = draw.ask(dict(space)).params
            study.enqueue_trial(params)
    study.set_user_attr(READY_ATTR, True)
    return study


def _check_same(study: Any, url: str, direction: str, space: Mapping[str, Any]) -> None:
    have = study.direction.name.lower()
    if have != direction.lower():
        raise PlanMismatchError(
            f"study {study.study_name!r} in {url} was created to {have}, this sweep asks to "
            f"{direction.lower()}; nothing was changed",
            hint="use the study's direction or a new study name",
        )
    stored = study.user_attrs.get(SPACE_ATTR)
    given = _space_json(space)
    if stored is not None and stored != given:
        diffs = sorted(k for k in set(stored) | set(given) if stored.get(k) != given.get(k))
        raise PlanMismatchError(
            f"study {study.study_name!r} in {url} has another search space (differs in "
            f"{', '.join(diffs)}); nothing was changed",
            hint="use the study's search space or a new study name",
        )


def _wait_ready(study: Any, wait_s: float) -> None:
    """Another worker is still creating the study (enqueueing its trials): wait for it."""
    deadline = time.monotonic() + wait_s
    while not study.user_attrs.get(READY_ATTR):
        if time.monotonic() > deadline:
            raise ConfigError(
                f"study {study.study_name!r} was never finished being created",
                hint="delete the study and start the sweep again",
            )
        time.sleep(0.2)


@dataclass
class WorkerResult:
    finished: list[int] = field(default_factory=list)  # trial numbers this worker told
    resumed: list[int] = field(default_factory=list)  # trial numbers it took over


def run_worker(
    objective: Objective,
    study: Any,
    url: str,
    *,
    run_root: str,
    trials: int,
    holder: str | None = None,
    lease_ttl_s: float = 30.0,
    poll_s: float = 0.5,
) -> WorkerResult:
    """Work on ``study`` (from :func:`open_study`, stored at ``url``) until ``trials`` trials
    are finished: take over trials whose lease expired (their worker died), otherwise start the
    next trial."""
    optuna = _optuna()
    leases = TrialLeases(url)
    holder = holder or f"{socket.gethostname()}:{os.getpid()}"
    result = WorkerResult()
    try:
        while True:
            picked = _pick(optuna, study, leases, holder, lease_ttl_s, trials)
            if picked == "done":
                return result
            if picked is None:
                time.sleep(poll_s)
                continue
            trial, token, resumed = picked
            if resumed:
                result.resumed.append(trial.number)
            if _run_trial(optuna, study, trial, token, leases, objective, run_root, holder,
                          lease_ttl_s):  # fmt: skip
                result.finished.append(trial.number)
    finally:
        leases.close()


def _pick(
    optuna: Any, study: Any, leases: TrialLeases, holder: str, ttl_s: float, trials: int
) -> Any:
    states = optuna.trial.TrialState
    all_trials = study.get_trials(deepcopy=False)
    if sum(t.state.is_finished() for t in all_trials) >= trials:
        return "done"
    held = leases.holders()
    now = time.time()
    for t in all_trials:
        if t.state != states.RUNNING:
            continue
        row = held.get(t._trial_id)
        if row is None:  # created, but its worker died before leasing it
            started = t.datetime_start.replace(tzinfo=timezone.utc).timestamp() \
                if t.datetime_start else now  # fmt: skip
            token = leases.take(t._trial_id, holder, ttl_s, new=True) \
                if now - started > ttl_s else None  # fmt: skip
        elif row[1] <= now:
            token = leases.take(t._trial_id, holder, ttl_s)
        else:
            continue
        if token is not None:
            return optuna.trial.Trial(study, t._trial_id), token, True
    waiting = any(t.state == states.WAITING for t in all_trials)
    if waiting or len(all_trials) < trials:
        return _start_next(optuna, study, leases, holder, ttl_s, trials)
    return None


def _start_next(
    optuna: Any, study: Any, leases: TrialLeases, holder: str, ttl_s: float, trials: int
) -> Any:
    """Start the next trial, one worker at a time: ``study.ask()`` pops a WAITING trial or,
    when another worker popped it first, creates one more, so two workers asking at once made
    ``trials + 1`` trials. Under the creation lease (it expires if its holder dies) the worker
    looks again and asks only while a trial is waiting or fewer than ``trials`` exist."""
    creating = leases.take_creation(holder, ttl_s)
    if creating is None:
        return None  # another worker is starting one: look again at the next poll
    try:
        all_trials = study.get_trials(deepcopy=False)
        waiting = any(t.state == optuna.trial.TrialState.WAITING for t in all_trials)
        if not waiting and len(all_trials) >= trials:
            return None
        trial = study.ask()
        token = leases.take(trial._trial_id, holder, ttl_s, new=True)
        return None if token is None else (trial, token, False)
    finally:
        leases.release(CREATING, creating)


def _run_trial(
    optuna: Any,
    study: Any,
    trial: Any,
    token: str,
    leases: TrialLeases,
    objective: Objective,
    run_root: str,
    holder: str,
    ttl_s: float,
) -> bool:
    """One attempt at one trial; True once the trial was told (finished)."""
    attempts = list(trial.user_attrs.get(ATTEMPTS_ATTR, []))
    attempts.append(
        {
            "holder": holder,
            "job": settings.JOB_ID.raw(),
            "attempt": settings.ATTEMPT.raw(),
            "pid": os.getpid(),
            "start": time.time(),
        }
    )
    trial.set_user_attr(ATTEMPTS_ATTR, attempts)
    lost = threading.Event()
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(ttl_s / 3):
            if not leases.renew(trial._trial_id, token, ttl_s):
                lost.set()
                return

    beat = threading.Thread(target=heartbeat, name="spotwise-trial-heartbeat", daemon=True)
    beat.start()
    run_dir = f"{run_root.rstrip('/')}/trial-{trial.number:05d}"
    state, value = optuna.trial.TrialState.COMPLETE, None
    try:
        value = objective(trial, run_dir)
    except optuna.TrialPruned:
        state = optuna.trial.TrialState.PRUNED
    except SystemExit:  # a notice: the Run saved; hand the trial to the next worker now
        stop.set()
        leases.release(trial._trial_id, token)
        raise
    except BaseException:
        stop.set()
        study.tell(trial, state=optuna.trial.TrialState.FAIL)
        raise
    finally:
        stop.set()
        beat.join()
    if lost.is_set() or not leases.renew(trial._trial_id, token, ttl_s):
        log.warning(
            "trial %d: lease lost while training; leaving it to its new holder", trial.number
        )
        return False
    study.tell(trial, value, state=state if state is not optuna.trial.TrialState.COMPLETE
               else None)  # fmt: skip
    return True


def study_sha256(study: Any) -> str:
    """SHA-256 over the sorted (number, params, value) of the COMPLETE trials."""
    optuna = _optuna()
    rows = sorted(
        (t.number, sorted(t.params.items()), t.value)
        for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    )
    return hashlib.sha256(json.dumps(rows).encode()).hexdigest()


def trial_rows(study: Any) -> list[dict[str, Any]]:
    """Per trial: number, state, value, params, attempts (who, which job attempt, when)."""
    rows = []
    for t in study.get_trials(deepcopy=False):
        rows.append({
            "number": t.number, "state": t.state.name, "value": t.value, "params": t.params,
            "attempts": t.user_attrs.get(ATTEMPTS_ATTR, []),
            "resumed_steps": t.user_attrs.get("spotwise.resumed_steps", []),
            "end": t.datetime_complete.replace(tzinfo=timezone.utc).timestamp()
            if isinstance(t.datetime_complete, datetime) else None,
        })  # fmt: skip
    return rows
