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
The decisions themselves are the pure functions in ``decisions.py``; time comes from ``clock``.
"""

from __future__ import annotations

import fcntl
import os
import shlex
import string
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from spotwise.control.decisions import (
    Next,
    Reason,
    after_attempt,
    choose_placement,
    classify,
    decision_placement,
    estimate_cost_usd,
    live_problem,
    ranked_zones,
    stop_for_budget,
    zone_offers,
)
from spotwise.control.heartbeat import Heartbeat, heartbeat_location, machine_env
from spotwise.control.pricing import zone_interruption_rates
from spotwise.control.progress import (
    Committed,
    compute_s,
    progress_s,
    read_committed,
)
from spotwise.control.providers import (
    AttemptStatus,
    Handle,
    LaunchRequest,
    NoticeKind,
    Phase,
    Placement,
    Provider,
    make_provider,
)
from spotwise.control.providers.base import adoptable, checkpoint_dir, orphans
from spotwise.control.secret_refs import file_values
from spotwise.control.spec import JobSpec, stored_spec
from spotwise.control.store import Attempt, Job, JobState, Store, spotwise_home
from spotwise.control.store.core import Guard
from spotwise.control.workdir import ARCHIVES, CodeArchive, split_workdir
from spotwise.control.workdir_home import submit_workdir
from spotwise.errors import (
    BudgetError,
    CapacityError,
    ConfigError,
    ControlError,
    ProviderError,
    SpotwiseError,
    TransientProviderError,
)
from spotwise.market.advisor import RankedZone
from spotwise.market.interruption import InterruptionModel, load_interruption_model
from spotwise.market.policies import Market, Problem, make_policy
from spotwise.market.policies.driver import PolicyDriver
from spotwise.notices.heartbeat import beat_every_s
from spotwise.telemetry.webhooks import notify_state

Clock = Callable[[], float]
ProgressReader = Callable[[str], Committed]


def provider_for(job: Job) -> Provider:
    spec = stored_spec(job.id, job.spec)
    return make_provider(
        spec.provider.name,
        spec.provider.options,
        epoch=job.created_at,
        instance_type=spec.resources.instance_type,
        resources=spec.resources,
    )


DEFAULT_DECISION_S = 60.0  # wall seconds between policy decisions (decision_interval)
DEFAULT_CHANGEOVER_S = 60.0  # wall seconds from losing a machine to training again (changeover)


def plans(spec: JobSpec, provider: Provider) -> bool:
    """Whether the job's policy decides its placements: market auto, a deadline, spot."""
    return spec.market == "auto" and spec.deadline_s is not None and provider.features.spot


def job_terms(
    spec: JobSpec, provider: Provider, compute_wall_s: float, zone: str
) -> tuple[Problem, float]:
    """The policy's job terms and tick in the market's time (``live_problem``), priced at
    ``zone``."""
    spot = provider.prices.of(Placement("spot", zone))
    assert spec.deadline_s is not None
    changeover = DEFAULT_CHANGEOVER_S if spec.changeover_s is None else spec.changeover_s
    return live_problem(
        compute_wall_s,
        spec.deadline_s,
        changeover,
        spec.decision_interval_s or DEFAULT_DECISION_S,
        spot.time_scale,
        spot.usd_per_hour,
        spot.ondemand_usd_per_hour,
    )


def build_driver(
    spec: JobSpec,
    provider: Provider,
    compute_wall_s: float,
    zones: tuple[str, ...],
    prior_rates_per_h: tuple[float, ...] | None = None,
) -> PolicyDriver:
    """The job's policy object over ``zones`` (index 0 the best: its on-demand zone, and the
    single-zone policies' zone), reset for the job's terms priced there, starting from the
    advisor's interruption rates of the zones (``prior_rates_per_h``, one per zone)."""
    problem, gap_s = job_terms(spec, provider, compute_wall_s, zones[0])
    return PolicyDriver(
        make_policy(spec.policy),
        problem,
        gap_s,
        zones,
        name=spec.policy,
        prior_rates_per_h=prior_rates_per_h,
    )


def submit(
    store: Store,
    spec: JobSpec,
    spec_path: str | None = None,
    owner: str | None = None,
    uploaded_workdir: str | None = None,
) -> Job:
    """Check the job can run (provider reachable, budget covers the estimate), then record it
    (``owner``: the server's caller who submitted it; ``uploaded_workdir``: the sha256 of the
    ``pack:`` workdir that caller's client uploaded, see ``spotwise.server.uploads``)."""
    provider = make_provider(
        spec.provider.name,
        spec.provider.options,
        epoch=time.time(),
        instance_type=spec.resources.instance_type,
        preflight=True,
        resources=spec.resources,
    )
    check_world(spec, provider)
    checkpoint_dir(spec.provider.name, provider.features, spec.checkpoint_dir, "<job id>")
    if spec.budget_usd is not None and spec.expected_runtime_s is not None:
        zone = provider.features.zones[0]
        market = "on-demand" if spec.market == "on-demand" or not provider.features.spot else "spot"
        cheapest = estimate_cost_usd(
            spec.expected_runtime_s, provider.prices.of(Placement(market, zone))
        )
        if cheapest > spec.budget_usd:
            raise BudgetError(
                f"budget ${spec.budget_usd:.2f} is below the estimated ${cheapest:.2f} for "
                f"{spec.expected_runtime_s:.0f}s of {market} on {spec.provider.name}",
                hint=f"raise budget_usd to at least {cheapest:.2f} or shorten the job",
            )
    if plans(spec, provider) and spec.expected_runtime_s:  # bad terms fail here
        build_driver(spec, provider, spec.expected_runtime_s, provider.features.zones)
    stored = spec.model_dump(mode="json")
    stored["workdir_archive"] = submit_workdir(
        spec.workdir,
        provider.features,
        spec.checkpoint_dir,
        store.home / ARCHIVES,
        spec.provider.name,
        uploaded=uploaded_workdir,
    )
    chosen = getattr(provider, "placement", None)  # a provider that chose where to run
    if chosen is not None:  # pins it, so every later controller runs the job there too
        stored["provider"]["options"].update(chosen.pins())
    job = store.create_job(spec.name, stored, spec_path, owner=owner)
    if chosen is not None:  # and says why
        store.event(job.id, "placement", chosen.message(), chosen.to_event())
    return job


def check_world(spec: JobSpec, provider: Provider) -> None:
    """Refuse more than one training process where the provider cannot start torch's launcher
    (``multi_node`` feature), instead of silently running one."""
    if spec.world_size > 1 and not provider.features.multi_node:
        raise ConfigError(
            f"nodes: {spec.nodes}, procs_per_node: {spec.procs_per_node}: provider "
            f"{spec.provider.name!r} runs one process per attempt",
            hint="use a provider that runs multi-node attempts (local, sim, slurm, aws, gcp, "
            "azure, kubernetes) or set nodes: 1 and procs_per_node: 1",
        )


def dry_run(spec: JobSpec) -> list[dict[str, Any]]:
    """The objects launching ``spec`` would create for its first attempt, as the provider's
    own manifests (``launch --dry-run``). Nothing is contacted or created."""
    provider = make_provider(
        spec.provider.name,
        spec.provider.options,
        epoch=time.time(),
        instance_type=spec.resources.instance_type,
        resources=spec.resources,
    )
    check_world(spec, provider)
    build = getattr(provider, "manifests", None)  # providers that create API objects have it
    if build is None:
        raise ConfigError(
            f"provider {spec.provider.name!r} creates no manifests to show",
            hint="--dry-run prints the objects a cluster provider (kubernetes) would create",
        )
    spot = provider.features.spot and spec.market != "on-demand"
    job_id = f"{spec.name[:24]}-dryrun"
    job_dir = spotwise_home() / "jobs" / job_id
    archive = submit_workdir(  # packed to name it in the pod's first step, not stored
        spec.workdir,
        provider.features,
        spec.checkpoint_dir,
        spotwise_home() / ARCHIVES,
        spec.provider.name,
        upload=False,
    )
    spec = spec.model_copy(update={"workdir_archive": archive})
    req = launch_request(
        spec,
        provider,
        job_id,
        1,
        Placement("spot" if spot else "on-demand", provider.features.zones[0]),
        job_dir=job_dir,
        log_path=job_dir / "job.log",
        reveal=False,
    )
    return list(build(req))


def controller_lock_path(job: Job) -> Path:
    return job.dir / "controller.lock"


@contextmanager
def controller_lock(job: Job):
    """Exactly one live embedded controller per job (a server's hold the job's lease)."""
    job.dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(controller_lock_path(job), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise ControlError(
            f"job {job.id} already has a running controller",
            hint=f"watch it with: spotwise status {job.id}",
        ) from None
    try:
        yield
    finally:
        os.close(fd)


def controller_alive(job: Job) -> bool:
    """Whether a controller drives the job: an embedded one on this host, or a server."""
    return embedded_alive(job) or server_drives(job)


def embedded_alive(job: Job) -> bool:
    from spotwise.control.providers.process import lock_held

    return lock_held(controller_lock_path(job))


def server_drives(job: Job) -> bool:
    """Whether a ``spotwise server`` replica holds the job's lease (as last read)."""
    return job.lease_owner is not None and job.lease_expires_at > time.time()


def attempts_dir(job_dir: Path) -> Path:
    return job_dir / "attempts"


def job_checkpoint_dir(spec: JobSpec, provider: Provider, job_id: str, job_dir: Path) -> str:
    """``$SPOTWISE_CHECKPOINT_DIR`` on the job's machines: durable for the provider (its rule,
    ``checkpoint_dir``), else on the controller's host, the job directory."""
    chosen = checkpoint_dir(spec.provider.name, provider.features, spec.checkpoint_dir, job_id)
    return chosen or str(job_dir / "checkpoint")


def launch_request(
    spec: JobSpec,
    provider: Provider,
    job_id: str,
    n: int,
    placement: Placement,
    *,
    job_dir: Path,
    log_path: Path,
    reveal: bool = True,
) -> LaunchRequest:
    """What attempt ``n`` of the job runs: command, environment, directories, placement
    (also what ``launch --dry-run`` shows, without ``reveal``ing secret files' contents, so it
    is built in this one place)."""
    ckpt = job_checkpoint_dir(spec, provider, job_id, job_dir)
    features = provider.features
    env = dict(os.environ) if features.same_host else {}
    if features.platform is not None:
        env["SPOTWISE_PLATFORM"] = features.platform
    env.update(spec.env)
    env.update(file_values(spec.env_from, reveal=reveal))  # read now, never stored
    env.update(
        SPOTWISE_JOB_ID=job_id,
        SPOTWISE_ATTEMPT=str(n),
        SPOTWISE_CHECKPOINT_DIR=ckpt,
        SPOTWISE_GRACE_S=f"{features.grace_s:g}",
    )
    env.update(machine_env(spec.unsupervised_limit_s, heartbeat_location(ckpt, features.same_host)))
    argv = list(spec.command)  # a remote machine expands $NAME itself, with its own values
    if features.same_host:
        argv = [string.Template(a).safe_substitute(env) for a in argv]
        if argv[0] in ("python", "python3"):
            argv[0] = sys.executable  # the interpreter spotwise runs in (its virtualenv)
    return LaunchRequest(
        job_id=job_id,
        n=n,
        argv=tuple(argv),
        workdir=Path(split_workdir(spec.workdir)[1]),
        env=env,
        log_path=log_path,
        attempt_dir=attempts_dir(job_dir) / str(n),
        placement=placement,
        grace_s=features.grace_s,
        nodes=spec.nodes,
        procs_per_node=spec.procs_per_node,
        env_from={k: r for k, r in spec.env_from.items() if r.file is None},
        code=CodeArchive.parse(spec.workdir_archive) if spec.workdir_archive else None,
    )


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
        self.job_id = store.job(job_id).id
        self.clock = clock
        self.sleep = sleep
        self.on_update = on_update
        job = store.job(self.job_id)
        self.spec = stored_spec(job.id, job.spec)
        self.provider = provider if provider is not None else provider_for(job)
        self.read_progress = read_progress
        self._interruptions = interruptions  # the advisor's estimates (default: shipped)
        self.fence = fence  # a server's lease: checked with every launch and terminate
        self._terminate_sent: dict[int, float] = {}  # attempt -> when we asked it to stop
        self._driver: PolicyDriver | None = None  # the job's policy, restored from the store
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
                raise ControlError(
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
            self._decide(job, attempt, now)
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
        if self._driver is not None and self._driver.decision is not None:
            placement = (
                None
                if self._stale(job, attempts)
                else decision_placement(self._driver.decision, self._driver.zones)
            )
            retry_at = self._boundary_wall(job, self._driver.tick + 1)
        else:
            placement = choose_placement(
                self.spec.market,
                self.provider.features.zones,
                job.blocked,
                attempts[-1].zone if attempts else "",
                now,
                spot_supported=self.provider.features.spot,
            )
            retry_at = now + 1.0
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
        handle = adoptable(self.provider.find(job.id, self._attempts_dir(job)), attempt.n)
        if handle is not None:
            self.store.event(
                self.job_id, "adopt", f"attempt {attempt.n} was already launched; adopting it"
            )
        else:
            self._fenced("launch", f"attempt {attempt.n}: launching", attempt.n)
            try:
                handle = self._launch_sized(self._request(job, attempt))
            except CapacityError as exc:
                self.store.discard_attempt(self.job_id, attempt.n, exc.message)
                blocked = dict(job.blocked)
                now = self.clock()
                blocked[attempt.zone] = now + self.spec.zone_cooldown_s
                # with a policy, the next try is its next decision (at the next boundary)
                retry_at = (
                    self._boundary_wall(job, self._driver.tick + 1)
                    if self._driver is not None
                    else now
                )
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

    def _launch_sized(self, req: LaunchRequest) -> Handle:
        """Launch on the job's ``nodes``, or, with ``min_nodes``, on the most machines the
        market has right now (the run resumes at the smaller world size)."""
        fewest = self.spec.min_nodes or req.nodes
        nodes = req.nodes
        while True:
            try:
                handle = self.provider.launch(replace(req, nodes=nodes))
            except CapacityError as exc:
                if nodes <= fewest:
                    raise
                self.store.event(self.job_id, "capacity", f"{exc.message}; trying {nodes - 1}")
                nodes -= 1
                continue
            if nodes < req.nodes:
                pricing = self.provider.prices.of(req.placement)
                self.store.update_attempt(
                    self.job_id,
                    req.n,
                    usd_per_hour=pricing.usd_per_hour * nodes,
                    ondemand_usd_per_hour=pricing.ondemand_usd_per_hour * nodes,
                )
                self.store.event(
                    self.job_id,
                    "nodes",
                    f"attempt {req.n} runs on {nodes} of {req.nodes} nodes (min_nodes "
                    f"{fewest}): the market lacks capacity for {req.nodes}",
                )
            return handle

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
        decision = after_attempt(reason, job.errors_used, self.spec.max_restarts)
        errors_used = job.errors_used + (1 if decision.counts_as_error else 0)
        if decision.next is Next.SUCCEED:
            self._set(JobState.SUCCEEDED, decision.message, errors_used=errors_used)
        elif decision.next is Next.CANCEL:
            self._set(JobState.CANCELLED, decision.message)
        elif decision.next is Next.FAIL:
            self._set(JobState.FAILED, detail or decision.message, errors_used=errors_used)
        else:
            blocked = dict(job.blocked)
            delay = 0.0
            if reason in (Reason.PREEMPTED, Reason.LOST):
                if attempt.market == "spot":
                    blocked[attempt.zone] = now + self.spec.zone_cooldown_s
                self._set(JobState.PREEMPTED, decision.message, blocked=blocked)
            elif reason is not Reason.SWITCHED:
                delay = self.spec.restart_backoff_s * 2 ** max(0, errors_used - 1)
            self._set(
                JobState.RECOVERING,
                decision.message,
                errors_used=errors_used,
                next_launch_at=now + delay,
                stop_reason="",
            )

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
            self.store, self.job_id, self.spec.name, self.spec.notify, state.value, message
        )

    # --- the job's policy ------------------------------------------------------------------
    def _tick_wall_s(self) -> float:
        return self.spec.decision_interval_s or DEFAULT_DECISION_S

    def _boundary_wall(self, job: Job, tick: int) -> float:
        return job.created_at + tick * self._tick_wall_s()

    def _checkpoint_dir(self, job: Job) -> str:
        """Where the job's progress is read: its machines' checkpoints, where this host can
        reach them (its own disk, an object store; not a pod's volume)."""
        ckpt = job_checkpoint_dir(self.spec, self.provider, job.id, job.dir)
        reachable = self.provider.features.same_host or "://" in ckpt
        return ckpt if reachable else str(job.dir / "checkpoint")

    def _load_driver(self, job: Job) -> PolicyDriver | None:
        """The job's one policy object: restored from the store, else created once the job's
        compute time is known; None when no policy plans this job."""
        if self._driver is None and job.policy is not None:
            self._driver = PolicyDriver.from_json(job.policy)
        if self._driver is not None or not plans(self.spec, self.provider):
            return self._driver
        done = self.read_progress(self._checkpoint_dir(job))
        total = compute_s(self.spec.steps, self.spec.expected_runtime_s, done.step_rate)
        if total > 0:
            ranked = self._rank_zones(job, total)
            self._driver = build_driver(
                self.spec,
                self.provider,
                total,
                tuple(r.zone for r in ranked),
                tuple(r.interruption_rate_per_h for r in ranked),
            )
        return self._driver

    def _rank_zones(self, job: Job, compute_wall_s: float) -> list[RankedZone]:
        """The zones the job's policy plans over, for its whole life: the advisor's best
        ``RANKED_ZONES`` of the provider's (in every region it offers), by expected cost for
        the job's terms, from the provider's spot prices, the interruption model's estimates
        and the job's own record so far (docs/control.md); their rates are the policy's prior.
        Recorded as a ``zones`` event."""
        features, prices = self.provider.features, self.provider.prices
        problem, _ = job_terms(self.spec, self.provider, compute_wall_s, features.zones[0])
        model = self._interruptions or load_interruption_model()
        # the advisor's name for the machine: what the provider runs (sim, aws), else the job's
        itype = getattr(self.provider, "instance_type", None) or self.spec.resources.instance_type
        offers = zone_offers(
            features.zones,
            [prices.of(Placement("spot", z)).usd_per_hour for z in features.zones],
            zone_interruption_rates(model, itype, features.zones),
            self.store.attempts(self.job_id),
            self.clock(),
        )
        ranked = ranked_zones(offers, problem, features.notice is not NoticeKind.NONE)
        self.store.event(
            self.job_id,
            "zones",
            f"policy {self.spec.policy} plans over "
            + ", ".join(
                f"{r.zone} (${r.usd_per_hour:.4g}/h, {r.interruption_rate_per_h:.3g}/h "
                f"interrupted, expected ${r.expected_cost_usd:.4g})"
                for r in ranked
            ),
            {"zones": [r.zone for r in ranked], "ranked": [r.to_dict() for r in ranked]},
        )
        return ranked

    def _decide(self, job: Job, attempt: Attempt | None, now: float) -> None:
        """At each tick boundary ask the job's policy, once, with what is known now (the
        simulator's observation: placement, changeover left, committed progress, availability
        and prices per zone, a preemption since the last boundary). When it wants another
        placement, stop the attempt (notice: it saves and exits 75); the new placement is
        launched as soon as that attempt has ended. The policy prices the changeover a switch
        costs (Uniform Progress's hysteresis, the spotwise plan's expected cost), so a switch
        happens only when the policy expects it to pay."""
        driver = self._load_driver(job)
        if driver is None:
            return
        tick = int((now - job.created_at) // self._tick_wall_s())
        if tick <= driver.tick:
            return
        zones = driver.zones
        prices = [self.provider.prices.of(Placement("spot", z)) for z in zones]
        scale = prices[0].time_scale
        here = None if attempt is None else Placement(attempt.market, attempt.zone)
        market, zone, left = Market.IDLE, None, 0.0
        # an attempt placed before the policy existed, in a zone outside its plan, is seen as
        # idle: the policy's decision then moves the job into its own zones
        if here is not None and (here.market != "spot" or here.zone in zones):
            assert attempt is not None
            market = Market.SPOT if here.market == "spot" else Market.ONDEMAND
            zone = zones.index(here.zone) if market is Market.SPOT else None
            left = max(0.0, driver.problem.changeover_s - (now - attempt.started_at) * scale)
        prices_now = self.provider.prices
        available = tuple(
            (prices_now.has_capacity(z, now) and job.blocked.get(z, 0.0) <= now) or z_i == zone
            for z_i, z in enumerate(zones)
        )
        last = self._boundary_wall(job, driver.tick)
        preempted = attempt is None and any(
            a.reason in (Reason.PREEMPTED.value, Reason.LOST.value) and (a.ended_at or 0) > last
            for a in self.store.attempts(self.job_id)
        )
        done = self.read_progress(self._checkpoint_dir(job))
        total_wall = driver.problem.compute_s / scale
        progress = min(
            driver.problem.compute_s, progress_s(done, self.spec.steps, total_wall) * scale
        )
        before = driver.decision
        decision = driver.decide(
            tick,
            progress,
            market,
            zone,
            left,
            available,
            tuple(p.usd_per_hour for p in prices),
            prices[0].ondemand_usd_per_hour,
            preempted,
        )
        event = None
        if decision != before:
            event = (
                "decision",
                f"policy {driver.name} at tick {tick}: {decision} "
                f"(progress {progress / 3600:.2f} of {driver.problem.compute_h:.2f} h)",
            )
        self.store.update_job(self.job_id, policy=driver.to_json(), event=event)
        want = decision_placement(decision, zones)
        if attempt is None or here is None or _same_place(here, want):
            return
        moving = f"{want.market} {want.zone}".rstrip() if want else "idle"
        self.store.update_job(
            self.job_id,
            stop_reason="switch",
            event=(
                "switch",
                f"attempt {attempt.n}: {here.market} {here.zone} -> {moving} "
                f"(policy {driver.name}, tick {tick}): saving and stopping it",
            ),
        )
        job.stop_reason = "switch"

    def _stale(self, job: Job, attempts: list[Attempt]) -> bool:
        """Whether the policy's last decision predates the end of the last attempt (a
        preemption or an error after it): then the next boundary decides again."""
        assert self._driver is not None
        last = attempts[-1] if attempts else None
        return (
            last is not None
            and last.reason != Reason.SWITCHED.value
            and (last.ended_at or 0.0) > self._boundary_wall(job, self._driver.tick)
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
        """Terminate a machine and wait (up to a minute) until the provider reports it ended."""
        self._terminate(handle)
        for _ in range(600):
            if self.provider.status(handle).phase in (Phase.EXITED, Phase.LOST):
                return
            self.sleep(0.1)

    def _attempts_dir(self, job: Job) -> Path:
        return attempts_dir(job.dir)

    def _sweep(self, job: Job) -> None:
        """Terminate every machine of the job that no open attempt owns (found by the
        provider's own bookkeeping: tags, job names, attempt directories)."""
        attempt = None if job.state.terminal else self._open_attempt()
        try:
            found = self.provider.find(job.id, self._attempts_dir(job))
        except TransientProviderError as exc:  # the next start or the job's end sweeps again
            self.store.event(
                self.job_id, "control-plane", f"orphan sweep not possible now: {exc.message}"
            )
            return
        for handle in orphans(
            found, attempt.n if attempt else None, attempt.handle if attempt else None
        ):
            if self.provider.status(handle).phase not in (Phase.EXITED, Phase.LOST):
                self.store.event(
                    self.job_id,
                    "orphan",
                    f"terminating {handle['id']} "
                    f"(attempt {handle['n']}), which no live attempt owns",
                )
                self._terminate_and_wait(handle)


def job_summary(store: Store, job: Job, now: float | None = None) -> dict[str, Any]:
    """The ``spotwise status --json`` document."""
    return job_summaries(store, [job], now)[0]


def job_summaries(
    store: Store, jobs: Sequence[Job], now: float | None = None
) -> list[dict[str, Any]]:
    """``job_summary`` of each job, reading the store a few times for all of them (not per job:
    a listing of thousands of jobs must answer in well under a second)."""
    now = time.time() if now is None else now
    ids = [job.id for job in jobs]
    attempts = store.attempts_by_job(ids)
    placements = store.last_event_data(ids, "placement")
    return [_summary(job, attempts[job.id], placements.get(job.id), now) for job in jobs]


def _shown_spec(stored: dict[str, Any]) -> dict[str, Any]:
    """What a listing shows of a job's stored spec, read as stored (validating 10,000 specs
    would dominate a listing, and a job recorded by an older spotwise must still be listed)."""
    provider = stored.get("provider")
    budget = stored.get("budget_usd")
    return {
        "command": shlex.join(str(w) for w in stored.get("command") or []),
        "provider": provider.get("name") if isinstance(provider, dict) else None,
        "market": stored.get("market"),
        "budget_usd": float(budget) if isinstance(budget, (int, float)) else None,
    }


def _summary(
    job: Job, attempts: list[Attempt], placement: dict[str, Any] | None, now: float
) -> dict[str, Any]:
    shown = _shown_spec(job.spec)
    cost = sum(a.cost_usd(now) for a in attempts)
    ondemand = sum(a.ondemand_cost_usd(now) for a in attempts)
    return {
        "id": job.id,
        "name": job.name,
        "state": job.state.value,
        "message": job.message,
        "command": shown["command"],
        "provider": shown["provider"],
        "market": shown["market"],
        "created_at": job.created_at,
        "updated_at": job.updated_at,
        "attempts": [a.as_dict(now) for a in attempts],
        "preemptions": sum(
            a.reason in (Reason.PREEMPTED.value, Reason.LOST.value) for a in attempts
        ),
        "switches": sum(a.reason == Reason.SWITCHED.value for a in attempts),
        "policy": _policy_summary(job.policy),
        "errors": job.errors_used,
        "cost_usd": round(cost, 6),
        "ondemand_cost_usd": round(ondemand, 6),
        "savings_usd": round(ondemand - cost, 6),
        "budget_usd": shown["budget_usd"],
        "log": str(job.log_path),
        "controller_alive": controller_alive(job),
        "placement": placement,  # where the provider chose to run, and why (aws advises one)
    }


def _same_place(here: Placement, want: Placement | None) -> bool:
    return (
        want is not None
        and here.market == want.market
        and (want.market != "spot" or want.zone == here.zone)
    )


def _policy_summary(doc: dict[str, Any] | None) -> dict[str, Any] | None:
    """The job's policy in ``status --json``: name, last boundary decided and its decision."""
    if doc is None:
        return None
    return {
        "name": doc["policy"],
        "tick": doc["tick"],
        "gap_s": doc["gap_s"],
        "zones": doc["zones"],
        "decision": doc["decision"],
    }
