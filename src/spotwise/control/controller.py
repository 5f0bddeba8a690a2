"""The recovery loop: drive one job through its states until it succeeds, fails or is cancelled.

PENDING -> LAUNCHING -> RUNNING -> SUCCEEDED
                ^           |-> PREEMPTED -> RECOVERING -> LAUNCHING ...   (exit 75, machine lost)
                |           |-> RECOVERING (error, while max_restarts allows) | FAILED
                +-- RECOVERING (no capacity: next zone / market)            CANCELLED, FAILED

Every transition is written to SQLite before it is acted on, and an attempt is recorded before
its launch, so a controller killed at any instant resumes where it was: it finds a launch whose
handle it lost through the provider (``find``), never starts a second attempt while one is open,
and bills every attempt from its launch. One controller per job: embedded, it holds the job's
``flock`` and refuses a job a server's lease holds; in ``spotwise server``, the job's lease
(``control/store/leases.py``), whose ``fence`` every launch and terminate passes first, and
which a server takes only while no embedded controller holds the ``flock``.
The decisions themselves are the pure functions in ``decisions.py``, the policy's view of the
job is ``planning.py``'s, what an attempt runs is ``launching.py``'s; time comes from ``clock``.
Submission (``submission.py``), who drives a job (``ownership.py``), the orphan sweep
(``orphans.py``) and the status view (``summary.py``) sit beside this loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from spotwise.control.decisions import Reason, classify, job_after_attempt, stop_for_budget
from spotwise.control.heartbeat import Heartbeat, heartbeat_location
from spotwise.control.launching import (
    attempts_dir,
    job_checkpoint_dir,
    launch_request,
    launch_sized,
)
from spotwise.control.orphans import sweep, terminate_and_wait
from spotwise.control.ownership import controller_lock, server_drives
from spotwise.control.planning import Clock, JobPolicy, ProgressReader, plans
from spotwise.control.progress import read_committed
from spotwise.control.providers import (
    AttemptStatus,
    Handle,
    LaunchRequest,
    Phase,
    Placement,
    Provider,
)
from spotwise.control.providers.base import adoptable
from spotwise.control.spec import stored_spec
from spotwise.control.store import Attempt, Job, JobState, Store
from spotwise.control.store.core import Guard
from spotwise.control.submission import provider_for
from spotwise.errors import (
    CapacityError,
    ControllerBusyError,
    ProviderError,
    SpotwiseError,
    TransientProviderError,
)
from spotwise.market.interruption import InterruptionModel
from spotwise.notices.heartbeat import beat_every_s
from spotwise.telemetry.webhooks import notify_state

__all__ = ["Controller"]


class Controller:
    """Runs one job to a terminal state; safe to start again after being killed."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        *,
        clock: Clock = time.time,
        sleep: Callable[[float], None] = time.sleep,
        on_update: Callable[[Job, list[Attempt]], None] | None = None,
        provider: Provider | None = None,
        read_progress: ProgressReader = read_committed,
        interruptions: InterruptionModel | None = None,
        fence: Guard | None = None,
    ) -> None:
        self.store = store
        job = store.job(job_id)
        self.job_id = job.id
        self.owner = job.owner  # (fixed at submit: whose webhooks hear of its states)
        self.clock = clock
        self.sleep = sleep
        self.on_update = on_update
        self.spec = stored_spec(job.id, job.spec)
        self.provider = provider if provider is not None else provider_for(job)
        self.fence = fence  # a server's lease: checked with every launch and terminate
        self._terminate_sent: dict[int, float] = {}  # attempt -> when we asked it to stop
        self.policy = JobPolicy(  # the job's policy, restored from the store
            store,
            self.job_id,
            self.spec,
            self.provider,
            clock=clock,
            read_progress=read_progress,
            interruptions=interruptions,
        )
        ckpt = job_checkpoint_dir(self.spec, self.provider, job.id, job.dir)
        self._heartbeat = Heartbeat(  # what tells the job's machines they are supervised
            heartbeat_location(ckpt, self.provider.features.same_host),
            self.spec.unsupervised_limit_s,
        )
        # the open attempt's handle when the last tick saw its machine running (else None):
        # a driver of many jobs waits for that machine's end instead of polling it
        self.running_handle: Handle | None = None

    # --- the loop --------------------------------------------------------------------------
    def run(self) -> JobState:
        job = self.store.job(self.job_id)
        with controller_lock(job):
            job = self.store.job(self.job_id)  # (read after the lock: the server reads after
            if server_drives(job):  # its lease, so one of the two always sees the other)
                raise ControllerBusyError(
                    f"job {job.id} is driven by spotwise server (replica {job.lease_owner})",
                    hint=f"watch it with: spotwise status {job.id}",
                )
            self.start(job)
            while True:
                state = self.tick()
                if state is not None:
                    return state
                self.sleep(self.provider.features.poll_s)

    @property
    def acts_on_time(self) -> bool:
        """Whether the job acts on time passing, not only on its machine's events: a budget
        that burns, a policy's decision boundaries. Such a job is ticked every poll."""
        return self.spec.budget_usd is not None or plans(self.spec, self.provider)

    @property
    def beat_every_s(self) -> float | None:
        """How often its ticks must come for the heartbeat to stay fresh (None: no heartbeat),
        however rarely its machine's events need them."""
        limit_s = self.spec.unsupervised_limit_s
        return None if limit_s is None else beat_every_s(limit_s)

    def start(self, job: Job) -> None:
        """What a controller does once, holding the job's lock, before its first ``tick``
        (also called by ``spotwise server``, which ticks every job it drives from one process)."""
        self.store.event(
            self.job_id,
            "controller",
            f"controller {os.getpid()} started in state {job.state.value}",
        )
        self._sweep(job)  # machines a crashed controller left behind

    def tick(self) -> JobState | None:
        """One pass of the loop: the job's final state once it has ended (after cleanup),
        else None (call again after ``poll_s``)."""
        self.running_handle = None
        job = self.store.job(self.job_id)
        if job.state.terminal:
            self._cleanup(job)
            if self.on_update:
                self.on_update(job, self.store.attempts(self.job_id))
            return job.state
        said = self._heartbeat.beat(self.clock())
        if said is not None:
            self.store.event(self.job_id, "heartbeat", said)
        try:
            self.step(job)
            if job.control_error_since is not None:
                self.store.update_job(self.job_id, control_error_since=None)
        except TransientProviderError as exc:
            self._control_plane_error(job, exc)
        if self.on_update:
            self.on_update(self.store.job(self.job_id), self.store.attempts(self.job_id))
        return None

    def step(self, job: Job) -> None:
        """One pass: what the open attempt is doing, the policy's decision at a tick boundary,
        then the next thing to do (launch, adopt, or wait)."""
        now = self.clock()
        if job.cancel_requested and job.stop_reason != "cancel":
            self.store.update_job(self.job_id, stop_reason="cancel")
            job.stop_reason = "cancel"
        attempt = self._open_attempt()
        if attempt is not None and attempt.handle is not None:
            self._watch(job, attempt, now)
            job, attempt = self.store.job(self.job_id), self._open_attempt()
            if job.state.terminal:
                return
        if job.stop_reason == "":
            self.policy.decide(job, attempt, now)
            if job.stop_reason == "switch" and attempt is not None and attempt.handle:
                self._stop(attempt.n, attempt.handle, now)  # the notice now, not at the next poll
                self._watch(job, attempt, now)
                job, attempt = self.store.job(self.job_id), self._open_attempt()
        if attempt is None:
            if job.stop_reason == "cancel":
                self._set(JobState.CANCELLED, "cancelled by the user")
            elif job.state in (
                JobState.PENDING,
                JobState.RECOVERING,
                JobState.PREEMPTED,
                JobState.LAUNCHING,
                JobState.RUNNING,
            ):
                self._maybe_launch(job, self.clock())  # billed from now, after the decision
        elif attempt.handle is None:
            self._launch_or_adopt(job, attempt)

    def _watch(self, job: Job, attempt: Attempt, now: float) -> None:
        assert attempt.handle is not None
        try:
            status = self.provider.status(attempt.handle)
        except TransientProviderError:
            raise
        except (ProviderError, OSError) as exc:
            # An unanswered status says nothing about the attempt: never an end, never a
            # relaunch. Only a confirmed end (exit code, machine gone) ends it; an outage
            # longer than control_plane_timeout fails the job (docs/control.md).
            raise TransientProviderError(f"status of attempt {attempt.n} failed: {exc}") from exc
        self.running_handle = attempt.handle if status.phase is Phase.RUNNING else None
        self._observe(job, attempt, status, now)

    # --- launching -------------------------------------------------------------------------
    def _maybe_launch(self, job: Job, now: float) -> None:
        if job.state is not JobState.RECOVERING and job.state is not JobState.PENDING:
            self._set(JobState.RECOVERING, "no attempt open; deciding the next one")
            return
        if now < job.next_launch_at:
            return
        attempts = self.store.attempts(self.job_id)
        if self.spec.budget_usd is not None:
            spent = sum(a.cost_usd(now) for a in attempts)
            if spent >= self.spec.budget_usd:
                self._set(
                    JobState.FAILED,
                    f"budget ${self.spec.budget_usd:.2f} spent (${spent:.2f}); state saved",
                )
                return
        placement, retry_at = self.policy.next_placement(job, attempts, now)
        if placement is None:
            self.store.update_job(self.job_id, next_launch_at=retry_at)
            return
        pricing = self.provider.prices.of(placement)
        attempt = self.store.open_attempt(
            self.job_id,
            provider=self.provider.name,
            market=placement.market,
            zone=placement.zone,
            usd_per_hour=pricing.usd_per_hour * self.spec.nodes,  # (every machine is billed)
            ondemand_usd_per_hour=pricing.ondemand_usd_per_hour * self.spec.nodes,
            time_scale=pricing.time_scale,
            now=now,
            guard=self.fence,
        )
        self._set(
            JobState.LAUNCHING, f"attempt {attempt.n}: {placement.market} {placement.zone}".rstrip()
        )
        self._launch_or_adopt(self.store.job(self.job_id), attempt)

    def _launch_or_adopt(self, job: Job, attempt: Attempt) -> None:
        """Start the attempt, unless a previous controller already did (crash recovery)."""
        handle = adoptable(self.provider.find(job.id, attempts_dir(job.dir)), attempt.n)
        if handle is not None:
            self.store.event(
                self.job_id, "adopt", f"attempt {attempt.n} was already launched; adopting it"
            )
        else:
            self._fenced("launch", f"attempt {attempt.n}: launching", attempt.n)
            try:
                handle = launch_sized(
                    self.provider, self.store, self._request(job, attempt), self.spec.min_nodes
                )
            except CapacityError as exc:
                self.store.discard_attempt(self.job_id, attempt.n, exc.message)
                blocked = dict(job.blocked)
                now = self.clock()
                blocked[attempt.zone] = now + self.spec.zone_cooldown_s
                # with a policy, the next try is its next decision (at the next boundary)
                retry_at = self.policy.next_boundary(job) or now
                self.store.update_job(
                    self.job_id,
                    blocked=blocked,
                    state=JobState.RECOVERING,
                    next_launch_at=retry_at,
                    message=f"{exc.message}; trying elsewhere",
                )
                return
            except TransientProviderError:
                raise  # the attempt stays open without a handle: find() settles it next time
            except Exception as exc:  # any failure ends the attempt, never leaves the job
                # LAUNCHING: a secret file gone since submit, a value the provider refuses
                message = exc.message if isinstance(exc, SpotwiseError) else f"{exc!r}"[:300]
                self._end_attempt(
                    job,
                    attempt,
                    AttemptStatus(Phase.EXITED, exit_code=None),
                    Reason.ERROR,
                    detail=f"launch failed: {message}",
                )
                return
        self.store.update_attempt(self.job_id, attempt.n, handle=handle)

    def _request(self, job: Job, attempt: Attempt) -> LaunchRequest:
        return launch_request(
            self.spec,
            self.provider,
            job.id,
            attempt.n,
            Placement(attempt.market, attempt.zone),
            job_dir=job.dir,
            log_path=job.log_path,
        )

    # --- watching --------------------------------------------------------------------------
    def _observe(self, job: Job, attempt: Attempt, status: AttemptStatus, now: float) -> None:
        assert attempt.handle is not None
        known_restarts = int(attempt.handle.get("restarts", 0))
        if status.restarts > known_restarts:  # the provider requeued it by itself (SLURM)
            self._end_attempt(
                job,
                attempt,
                status,
                Reason.PREEMPTED,
                now=now,
                detail=f"requeued by {self.provider.name}",
            )
            job = self.store.job(self.job_id)
            if job.state is JobState.RECOVERING:
                nxt = self.store.open_attempt(
                    self.job_id,
                    provider=attempt.provider,
                    market=attempt.market,
                    zone=attempt.zone,
                    usd_per_hour=attempt.usd_per_hour,
                    ondemand_usd_per_hour=attempt.ondemand_usd_per_hour,
                    time_scale=attempt.time_scale,
                    handle={**attempt.handle, "restarts": status.restarts},
                    now=now,
                    guard=self.fence,
                )
                self._set(JobState.LAUNCHING, f"attempt {nxt.n}: requeued")
            return
        if status.phase is Phase.QUEUED:
            # no machine yet: the attempt is billed from when it leaves the queue, so its
            # start moves with each look (the wait shows as changeover, with no machine held)
            self.store.update_attempt(self.job_id, attempt.n, started_at=now)
            queued = f"attempt {attempt.n} queued: {status.detail}"
            if job.state is not JobState.LAUNCHING or job.message != queued:
                self._set(JobState.LAUNCHING, queued)
        elif status.phase is Phase.STARTING:
            if job.state is not JobState.LAUNCHING:
                self._set(JobState.LAUNCHING, "waiting for the machine")
        elif status.phase is Phase.RUNNING:
            if attempt.state != "running":
                self.store.update_attempt(
                    self.job_id, attempt.n, state="running", running_at=status.running_at or now
                )
                self._set(JobState.RUNNING, f"attempt {attempt.n} running")
            self._check_budget(job, attempt, now)
        if job.stop_reason and now - self._terminate_sent.get(attempt.n, -1e18) > 10.0:
            self._stop(attempt.n, attempt.handle, now)  # repeated, in case one was missed
        if status.phase in (Phase.EXITED, Phase.LOST):
            self._end_attempt(job, attempt, status, classify(status, job.stop_reason), now=now)

    def _stop(self, n: int, handle: Handle, now: float) -> None:
        self._terminate_sent[n] = now
        self._terminate(handle)

    def _terminate(self, handle: Handle) -> None:
        self._fenced("terminate", f"attempt {handle['n']}: terminating {handle['id']}", handle["n"])
        self.provider.terminate(handle)

    def _fenced(self, kind: str, message: str, n: int) -> None:
        """Under a server's lease (``fence``), record the launch or terminate about to be made
        in a transaction that checks the lease still holds: a replica that lost the job raises
        ``LeaseLost`` here and leaves the machines to the new owner. (Embedded, the job's file
        lock is what keeps a second controller away.)"""
        if self.fence is not None:
            self.store.event(self.job_id, kind, message, {"n": n}, guard=self.fence)

    def _check_budget(self, job: Job, attempt: Attempt, now: float) -> None:
        if self.spec.budget_usd is None or job.stop_reason:
            return
        spent = sum(a.cost_usd(now) for a in self.store.attempts(self.job_id))
        burn = attempt.usd_per_hour * attempt.time_scale / 3600.0
        horizon = self.provider.features.grace_s + 2 * self.provider.features.poll_s
        if stop_for_budget(spent, burn, self.spec.budget_usd, horizon):
            self.store.update_job(
                self.job_id,
                stop_reason="budget",
                event=(
                    "budget",
                    f"${spent:.2f} spent of ${self.spec.budget_usd:.2f}: stopping attempt "
                    f"{attempt.n} so it saves before the budget runs out",
                ),
            )
            job.stop_reason = "budget"

    def _end_attempt(
        self,
        job: Job,
        attempt: Attempt,
        status: AttemptStatus,
        reason: Reason,
        now: float | None = None,
        detail: str = "",
    ) -> None:
        now = self.clock() if now is None else now
        ended_at = min(status.ended_at or now, now)
        self.store.update_attempt(
            self.job_id,
            attempt.n,
            state="ended",
            ended_at=ended_at,
            reason=reason.value,
            exit_code=status.exit_code,
        )
        self.store.event(
            self.job_id,
            "attempt-end",
            f"attempt {attempt.n} ended: {reason.value}"
            + (f" ({detail or status.detail})" if detail or status.detail else ""),
            {"n": attempt.n, "exit_code": status.exit_code, "reason": reason.value},
        )
        for state, message, fields in job_after_attempt(
            reason,
            attempt,
            job,
            now,
            max_restarts=self.spec.max_restarts,
            zone_cooldown_s=self.spec.zone_cooldown_s,
            restart_backoff_s=self.spec.restart_backoff_s,
            detail=detail,
        ):
            self._set(state, message, **fields)

    def _control_plane_error(self, job: Job, exc: TransientProviderError) -> None:
        now = self.clock()
        since = job.control_error_since or now
        if job.control_error_since is None:
            self.store.update_job(
                self.job_id,
                control_error_since=now,
                event=("control-plane", f"provider error: {exc.message}"),
            )
        if now - since > self.spec.control_plane_timeout_s:
            self._set(
                JobState.FAILED,
                f"provider {self.provider.name} unreachable for {now - since:.0f}s: {exc.message}",
            )

    # --- helpers ---------------------------------------------------------------------------
    def _open_attempt(self) -> Attempt | None:
        for a in self.store.attempts(self.job_id):
            if a.state != "ended":
                return a
        return None

    def _set(self, state: JobState, message: str, **fields: Any) -> None:
        self.store.update_job(
            self.job_id,
            state=state,
            message=message,
            event=("state", f"{state.value}: {message}"),
            **fields,
        )
        notify_state(
            self.store,
            self.job_id,
            self.spec.name,
            self.owner,
            self.spec.notify,
            state.value,
            message,
        )

    def _cleanup(self, job: Job) -> None:
        """A finished job leaves nothing running: end any attempt still open, sweep the rest."""
        attempt = self._open_attempt()
        if attempt is not None:
            if attempt.handle is not None:
                self._terminate_and_wait(attempt.handle)
            self.store.update_attempt(
                self.job_id,
                attempt.n,
                state="ended",
                ended_at=self.clock(),
                reason=job.state.value.lower(),
            )
        self._sweep(job)

    def _terminate_and_wait(self, handle: Handle) -> None:
        terminate_and_wait(self.provider, handle, self._terminate, self.sleep)

    def _sweep(self, job: Job) -> None:
        """Terminate every machine of the job that no open attempt owns."""
        attempt = None if job.state.terminal else self._open_attempt()
        sweep(
            self.store, self.provider, job, attempts_dir(job.dir), attempt, self._terminate_and_wait
        )
