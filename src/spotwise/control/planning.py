"""The job's policy as the controller consults it: its terms in the market's time, the zones it
plans over, and, at each decision boundary, the observation built from live state (placement,
changeover left, committed progress, availability and prices per zone, a recent preemption)
that the simulator would have given it. ``observe`` is pure; ``JobPolicy`` reads the store,
the provider's prices and the checkpoints, and records what the policy decided.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spotwise.control.decisions import (
    Reason,
    choose_placement,
    decision_placement,
    live_problem,
    ranked_zones,
    zone_offers,
)
from spotwise.control.launching import job_checkpoint_dir
from spotwise.control.pricing import zone_interruption_rates
from spotwise.control.progress import Committed, compute_s, progress_s
from spotwise.control.providers import NoticeKind, Placement, Pricing, Provider
from spotwise.control.spec import JobSpec
from spotwise.control.store import Attempt, Job, Store
from spotwise.market.advisor import RankedZone
from spotwise.market.interruption import InterruptionModel, load_interruption_model
from spotwise.market.policies import Market, Problem, make_policy
from spotwise.market.policies.driver import PolicyDriver

Clock = Callable[[], float]
ProgressReader = Callable[[str], Committed]

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


@dataclass(frozen=True)
class Boundary:
    """What the job's policy is told at one decision boundary (``PolicyDriver.decide``'s
    arguments), in the market's time."""

    tick: int
    progress_s: float
    market: Market
    zone: int | None  # index into the policy's zones while on spot there
    changeover_left_s: float
    available: tuple[bool, ...]
    spot_prices: tuple[float, ...]
    ondemand_price: float
    preempted: bool  # an attempt was taken away since the last boundary


def observe(
    driver: PolicyDriver,
    tick: int,
    attempt: Attempt | None,
    now: float,
    prices: Sequence[Pricing],
    open_zones: Sequence[bool],
    attempts: Sequence[Attempt],
    done: Committed,
    steps: int | None,
    last_boundary_wall: float,
) -> Boundary:
    """The simulator's observation rebuilt from live state: ``prices`` and ``open_zones``
    (capacity and no cooldown) per policy zone, the job's ``attempts``, its committed progress
    ``done``. An attempt placed before the policy existed, in a zone outside its plan, is seen as
    idle: the policy's decision then moves the job into its own zones."""
    zones = driver.zones
    scale = prices[0].time_scale
    market, zone, left = Market.IDLE, None, 0.0
    if attempt is not None and (attempt.market != "spot" or attempt.zone in zones):
        market = Market.SPOT if attempt.market == "spot" else Market.ONDEMAND
        zone = zones.index(attempt.zone) if market is Market.SPOT else None
        left = max(0.0, driver.problem.changeover_s - (now - attempt.started_at) * scale)
    preempted = attempt is None and any(
        a.reason in (Reason.PREEMPTED.value, Reason.LOST.value)
        and (a.ended_at or 0) > last_boundary_wall
        for a in attempts
    )
    total_wall = driver.problem.compute_s / scale
    return Boundary(
        tick=tick,
        progress_s=min(driver.problem.compute_s, progress_s(done, steps, total_wall) * scale),
        market=market,
        zone=zone,
        changeover_left_s=left,
        available=tuple(o or z_i == zone for z_i, o in enumerate(open_zones)),
        spot_prices=tuple(p.usd_per_hour for p in prices),
        ondemand_price=prices[0].ondemand_usd_per_hour,
        preempted=preempted,
    )


class JobPolicy:
    """One job's policy object for its controller: restored from the store, else created once
    the job's compute time is known; asked once per tick boundary."""

    def __init__(
        self,
        store: Store,
        job_id: str,
        spec: JobSpec,
        provider: Provider,
        *,
        clock: Clock,
        read_progress: ProgressReader,
        interruptions: InterruptionModel | None,
    ) -> None:
        self.store = store
        self.job_id = job_id
        self.spec = spec
        self.provider = provider
        self.clock = clock
        self.read_progress = read_progress
        self._interruptions = interruptions  # the advisor's estimates (default: shipped)
        self.driver: PolicyDriver | None = None

    def tick_wall_s(self) -> float:
        return self.spec.decision_interval_s or DEFAULT_DECISION_S

    def boundary_wall(self, job: Job, tick: int) -> float:
        return job.created_at + tick * self.tick_wall_s()

    def next_boundary(self, job: Job) -> float | None:
        """When the policy decides next (a launch that failed waits for it); None: no policy."""
        return None if self.driver is None else self.boundary_wall(job, self.driver.tick + 1)

    def next_placement(
        self, job: Job, attempts: list[Attempt], now: float
    ) -> tuple[Placement | None, float]:
        """Where the next attempt runs (None: nowhere yet) and when to look again: the policy's
        last decision (unless an attempt ended after it: the next boundary decides again), else
        the job's market over the zones not cooling down."""
        if self.driver is not None and self.driver.decision is not None:
            stale = self._stale(job, attempts)
            where = None if stale else decision_placement(self.driver.decision, self.driver.zones)
            return where, self.boundary_wall(job, self.driver.tick + 1)
        where = choose_placement(
            self.spec.market,
            self.provider.features.zones,
            job.blocked,
            attempts[-1].zone if attempts else "",
            now,
            spot_supported=self.provider.features.spot,
        )
        return where, now + 1.0

    def checkpoint_dir(self, job: Job) -> str:
        """Where the job's progress is read: its machines' checkpoints, where this host can
        reach them (its own disk, an object store; not a pod's volume)."""
        ckpt = job_checkpoint_dir(self.spec, self.provider, job.id, job.dir)
        reachable = self.provider.features.same_host or "://" in ckpt
        return ckpt if reachable else str(job.dir / "checkpoint")

    def load(self, job: Job) -> PolicyDriver | None:
        """The job's one policy object; None when no policy plans this job."""
        if self.driver is None and job.policy is not None:
            self.driver = PolicyDriver.from_json(job.policy)
        if self.driver is not None or not plans(self.spec, self.provider):
            return self.driver
        done = self.read_progress(self.checkpoint_dir(job))
        total = compute_s(self.spec.steps, self.spec.expected_runtime_s, done.step_rate)
        if total > 0:
            ranked = self._rank_zones(total)
            self.driver = build_driver(
                self.spec,
                self.provider,
                total,
                tuple(r.zone for r in ranked),
                tuple(r.interruption_rate_per_h for r in ranked),
            )
        return self.driver

    def _rank_zones(self, compute_wall_s: float) -> list[RankedZone]:
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

    def decide(self, job: Job, attempt: Attempt | None, now: float) -> None:
        """At each tick boundary ask the job's policy, once, with what is known now
        (``observe``). When it wants another placement, mark the job's attempt to stop
        (``stop_reason`` "switch": notice, it saves and exits 75); the new placement is
        launched as soon as that attempt has ended. The policy prices the changeover a switch
        costs (Uniform Progress's hysteresis, the spotwise plan's expected cost), so a switch
        happens only when the policy expects it to pay."""
        driver = self.load(job)
        if driver is None:
            return
        tick = int((now - job.created_at) // self.tick_wall_s())
        if tick <= driver.tick:
            return
        zones = driver.zones
        market = self.provider.prices
        prices = [market.of(Placement("spot", z)) for z in zones]
        open_zones = [market.has_capacity(z, now) and job.blocked.get(z, 0.0) <= now for z in zones]
        seen = observe(
            driver,
            tick,
            attempt,
            now,
            prices,
            open_zones,
            self.store.attempts(self.job_id),
            self.read_progress(self.checkpoint_dir(job)),
            self.spec.steps,
            self.boundary_wall(job, driver.tick),
        )
        before = driver.decision
        decision = driver.decide(
            seen.tick,
            seen.progress_s,
            seen.market,
            seen.zone,
            seen.changeover_left_s,
            seen.available,
            seen.spot_prices,
            seen.ondemand_price,
            seen.preempted,
        )
        event = None
        if decision != before:
            event = (
                "decision",
                f"policy {driver.name} at tick {tick}: {decision} "
                f"(progress {seen.progress_s / 3600:.2f} of {driver.problem.compute_h:.2f} h)",
            )
        self.store.update_job(self.job_id, policy=driver.to_json(), event=event)
        want = decision_placement(decision, zones)
        if attempt is not None and not _same_place(Placement(attempt.market, attempt.zone), want):
            self._switch(job, attempt, want, f"policy {driver.name}, tick {tick}")

    def _switch(self, job: Job, attempt: Attempt, want: Placement | None, why: str) -> None:
        """Mark the attempt to stop (it saves and exits 75) so that ``want`` runs next."""
        moving = f"{want.market} {want.zone}".rstrip() if want else "idle"
        self.store.update_job(
            self.job_id,
            stop_reason="switch",
            event=(
                "switch",
                f"attempt {attempt.n}: {attempt.market} {attempt.zone} -> {moving} "
                f"({why}): saving and stopping it",
            ),
        )
        job.stop_reason = "switch"

    def _stale(self, job: Job, attempts: list[Attempt]) -> bool:
        """Whether the policy's last decision predates the end of the last attempt (a
        preemption or an error after it): then the next boundary decides again."""
        assert self.driver is not None
        last = attempts[-1] if attempts else None
        return (
            last is not None
            and last.reason != Reason.SWITCHED.value
            and (last.ended_at or 0.0) > self.boundary_wall(job, self.driver.tick)
        )


def _same_place(here: Placement, want: Placement | None) -> bool:
    return (
        want is not None
        and here.market == want.market
        and (want.market != "spot" or want.zone == here.zone)
    )
