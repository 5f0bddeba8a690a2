"""spotwise: plan against a learned model of spot availability, hop zones, never miss.

Uniform Progress follows a fixed line; the optimum knows the future. This policy sits between:

1. **Learn** each zone's availability online as a semi-Markov chain: the probability per tick
   that spot goes away (or comes back) given how long the current up (down) run has lasted, in
   ``ages`` buckets that double in length (default 4: 1, 2-3, 4-7, 8+ ticks), from the trace
   *before* the run and what the run has seen so far, with a weak prior (2 h up / 2 h down).
   Nothing after "now" is ever read.
2. **Plan** by solving the exact DP of the optimal policy (same model, same lattice) in
   expectation under that chain: the batch axis becomes the joint (availability, age) state of
   the ``max_zones`` best zones. The plan knows the changeover cost, the deadline and the prices, so
   it decides when idling is worth the slack, when to buy on-demand, when to come back to spot and
   when to hop to another zone instead of waiting. It re-plans every ``replan_h`` hours with the
   updated statistics.
3. **Guard** the deadline with the Safety Net invariants, whatever the plan says: idle only with
   R(t) >= C(t) + 2d (and one more tick to spare when ticks are longer than d), start spot only
   under that same condition, and once it fails while idle, on-demand until the end. Hence the
   deadline is met whenever on-demand only would meet it (C + d <= R).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np

from spotwise.market.policies.base import BasePolicy, Decision, Market, Observation, Problem
from spotwise.market.policies.optimal import Lattice, decode, solve, state_index, waste_cell


def bucket_of(age: np.ndarray, ages: int) -> np.ndarray:
    """The age bucket of a run that has lasted ``age`` ticks: buckets double in length (1, 2-3,
    4-7, ...), the last one open. Run lengths are heavy-tailed (on the 2023 V100 traces the
    per-tick end probability falls from ~0.2 at 10 minutes to ~0.006 past two hours), so the
    buckets that tell a fresh run from an old one must be short early and long late."""
    return np.minimum(np.floor(np.log2(np.maximum(age, 1))).astype(int), ages - 1)


def bucket_widths(ages: int) -> tuple[int, ...]:
    """Ticks per bucket (the last, open one counted as 1: it has no next bucket)."""
    return tuple(2**b if b < ages - 1 else 1 for b in range(ages))


PRIOR_UP_H = 2.0  # mean spot up-run (hours) assumed where nothing else is known


def hazard_estimate(
    seq: np.ndarray,
    gap_s: float,
    ages: int = 2,
    prior_up_h: float = PRIOR_UP_H,
    prior_down_h: float = 2.0,
    prior_weight_h: float = 12.0,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-tick probability that spot goes away (up) / comes back (down), by the age bucket of
    the current run (``bucket_of``): ((down buckets), (up buckets)).

    Ages make it a semi-Markov model: real up-runs are often short at first and long once they
    have lasted (a fresh start is riskier than a run that has held), which one rate cannot say.
    """
    seq = np.asarray(seq, dtype=bool)
    n = seq.size
    pseudo = prior_weight_h * 3600.0 / gap_s / 2.0 / ages  # pseudo-ticks per (state, bucket)
    rates = (gap_s / (prior_down_h * 3600.0), gap_s / (prior_up_h * 3600.0))
    out: list[tuple[float, ...]] = []
    if n >= 2:
        idx = np.arange(n)
        change = np.r_[True, seq[1:] != seq[:-1]]
        age = bucket_of(idx - np.maximum.accumulate(np.where(change, idx, 0)) + 1, ages)[:-1]
        state, ended = seq[:-1], change[1:]
    for s in (False, True):
        row = []
        for a in range(ages):
            if n >= 2:
                here = (state == s) & (age == a)
                count, ends = float(here.sum()), float((here & ended).sum())
            else:
                count = ends = 0.0
            h = (ends + pseudo * rates[s]) / (count + pseudo)
            row.append(min(max(h, 1e-4), 1 - 1e-4))
        out.append(tuple(row))
    return out[0], out[1]


def run_age(seq: list[bool], ages: int, stride: int = 1) -> int:
    """The age bucket (0-based) of the latest run of ``seq``, counting every ``stride``-th
    value back from the last (ticks of a coarser planning grid)."""
    cap = 2 ** (ages - 1)
    age = 0
    last = seq[-1]
    for i in range(len(seq) - 1, -1, -stride):
        if seq[i] != last or age >= cap:
            break
        age += 1
    return int(bucket_of(np.asarray(age), ages))


def planning_problem(problem: Problem, gap_s: float, max_cells: int) -> Problem:
    """The same job with the changeover's last partial tick rounded to a coarser grid.

    The exact lattice can be fine (15 s for 195 s ticks and d = 720 s: 2,881 cells); a plan made
    on G/k steps (65 s here, d planned as 715 s) is as good a guide, several times cheaper. The
    guard, not the plan, is what keeps the deadline.
    """
    exact = Lattice.of(problem, gap_s)
    if exact.cells <= max_cells:
        return problem
    slack = problem.deadline_s - problem.compute_s
    gap_ms = round(gap_s * 1000)
    k = max(1, math.floor(gap_s * max_cells / slack))
    while gap_ms % k:  # G/k on the millisecond grid, so the planned lattice is exact
        k -= 1
    unit = gap_ms // k / 1000
    d = problem.changeover_s
    whole = math.floor(d / gap_s + 1e-9) * gap_s
    part = d - whole
    if part > 1e-9:
        part = min(gap_s, max(unit, round(part / unit) * unit))
    return dataclasses.replace(problem, changeover_h=(whole + part) / 3600.0)


def _quantize(hazards: tuple[tuple[float, ...], ...]) -> tuple[tuple[float, ...], ...]:
    """Round probabilities to a 25 % log grid, so that similar estimates share a cached plan."""
    return tuple(
        tuple(min(_STEP ** round(math.log(p) / math.log(_STEP)), 1 - 1e-4) for p in row)
        for row in hazards
    )


_STEP = 1.25


@functools.lru_cache(maxsize=12)
def plan_table(
    problem: Problem,
    gap_s: float,
    hazards: tuple[tuple[tuple[float, ...], ...], ...],
    prices: tuple[float, ...],
    first_tick: int,
    horizon: int,
) -> tuple[np.ndarray | None, Lattice]:
    """Decisions of the expected-cost DP for independent per-zone semi-Markov availability
    (``hazard_estimate`` per zone), for boundaries first_tick .. first_tick + horizon - 1.

    The batch axis is the joint (state, age bucket) of the zones, first zone most significant.
    """
    n = len(hazards)
    ages = len(hazards[0][0])
    width = 2 * ages  # per zone: down buckets, then up buckets
    transition: np.ndarray = np.ones((1, 1))
    widths = bucket_widths(ages)
    for down, up in hazards:
        step = np.zeros((width, width))
        for s, row in enumerate((down, up)):
            for a, h in enumerate(row):
                i = s * ages + a
                # a run that survives leaves bucket a after its 2^a ticks: 1/2^a per tick
                grow = 1.0 / widths[a]
                step[i, s * ages + min(a + 1, ages - 1)] += (1 - h) * grow
                step[i, i] += (1 - h) * (1 - grow)
                step[i, (1 - s) * ages] += h
        transition = np.kron(transition, step)
    combos = width**n
    digits = (np.arange(combos)[:, None] // width ** np.arange(n - 1, -1, -1)[None, :]) % width
    bits = digits >= ages  # combos x n: spot up in zone i
    ticks = math.ceil(problem.deadline_s / gap_s - 1e-9)
    available = np.broadcast_to(bits[:, :, None], (combos, n, ticks))
    price = np.broadcast_to(np.array(prices)[None, :, None], (combos, n, ticks))
    _, table, lattice = solve(
        problem,
        gap_s,
        available,
        price,
        keep_decisions=horizon,
        transition=transition,
        first_tick=first_tick,
    )
    if table is not None:
        table.setflags(write=False)
    return table, lattice


class SpotwisePolicy(BasePolicy):
    name = "spotwise"

    def __init__(
        self,
        max_zones: int = 2,
        replan_h: float = 24.0,
        window_h: float = 24.0 * 14,
        max_cells: int = 800,
        ages: int = 4,
        plan_tick_s: float = 100.0,
        max_states: int = 16,
    ):
        super().__init__()
        self.ages = ages
        self.max_states = max_states
        self.plan_tick_s = plan_tick_s
        self.max_zones = max_zones
        self.replan_h = replan_h
        self.window_h = window_h
        self.max_cells = max_cells

    def reset(
        self,
        problem: Problem,
        gap_s: float,
        zones: int,
        history: np.ndarray | None,
        prior_rates_per_h: tuple[float, ...] | None = None,
    ) -> None:
        super().reset(problem, gap_s, zones, history, prior_rates_per_h)
        # Each zone's prior mean up-run: the advisor's 1 / interruption rate where given (a live
        # job starts with no history, so these are what its first plans rank zones by), else
        # the built-in PRIOR_UP_H; it weighs as much as hazard_estimate's prior_weight_h of
        # observation, so history and the run's own ticks soon outweigh it.
        self._prior_up_h = (
            [PRIOR_UP_H] * zones
            if prior_rates_per_h is None
            else [1.0 / max(r, 1e-6) for r in prior_rates_per_h]
        )
        # Plan on ticks of at least plan_tick_s (k trace ticks each): with 34 s ticks and
        # d = 720 s the exact plan has 22 changeover phases and 6,353 ticks; planning on 68 s
        # ticks took a twelfth of the time and a seventh of the memory (docs/policies.md), and
        # the guard, not the plan, keeps the deadline. Ticks >= plan_tick_s: planned as they are.
        self._k = max(1, math.floor(self.plan_tick_s / gap_s + 1e-9))
        self._plan_gap = gap_s * self._k
        self._plan_problem = planning_problem(problem, self._plan_gap, self.max_cells)
        keep = max(0, math.ceil(self.window_h * 3600.0 / gap_s))
        past = np.zeros((zones, 0), bool) if history is None else np.asarray(history, bool)
        self._past = [list(past[z, -keep:]) if keep else [] for z in range(zones)]
        self._plan_tick = -1
        self._plan: dict[str, Any] | None = None
        self._table: np.ndarray | None = None

    # -- learning and planning -------------------------------------------------------------
    def _replan(self, obs: Observation) -> None:
        k = self._k
        # the buckets of a plan over max_zones zones (or all there are), also for the ranking
        ages = self._plan_ages(min(self.max_zones, self.zones))
        estimates = [
            hazard_estimate(np.array(seq)[::-1][::k][::-1], self._plan_gap, ages, prior_up_h=up_h)
            for seq, up_h in zip(self._past, self._prior_up_h, strict=True)
        ]
        # rank zones by long-run availability under the old-age rates
        stationary = [d[-1] / (u[-1] + d[-1]) for d, u in estimates]
        order = sorted(range(self.zones), key=lambda z: (-stationary[z], estimates[z][1][-1]))
        chosen = order[: self.max_zones]
        if obs.market is Market.SPOT and obs.zone is not None and obs.zone not in chosen:
            chosen = [obs.zone, *chosen[: self.max_zones - 1]]
        elif self._stranded(obs, chosen):  # plan over the best zone that has spot now
            up = next(z for z in order if obs.available[z])
            chosen = [up, *chosen[: self.max_zones - 1]]
        self._plan = {
            "tick": obs.tick // k,  # on the planning grid
            "zones": list(chosen),
            "hazards": [_quantize(estimates[z]) for z in chosen],
            "prices": [obs.spot_prices[z] for z in chosen],
        }
        self._load_plan()

    def _plan_ages(self, zones: int) -> int:
        """Age buckets per zone in a plan over ``zones`` zones: ``ages``, fewer where the joint
        availability state ((2 x buckets) ** zones) would pass ``max_states``. The plan's work
        grows faster than that state: two zones of 3 buckets (36 states) took 3-5x as long as
        two zones of 2 (16 states), the default bound (two-zone plans keep their old size)."""
        a = self.ages
        while a > 1 and (2 * a) ** zones > self.max_states:
            a -= 1
        return a

    def _load_plan(self) -> None:
        """The plan's decision table from its inputs (recomputed, not stored: it is derived)."""
        plan = self._plan
        assert plan is not None
        horizon = max(1, math.ceil(self.replan_h * 3600.0 / self._plan_gap))
        self._zones = tuple(int(z) for z in plan["zones"])
        hazards = tuple(tuple(tuple(float(p) for p in row) for row in z) for z in plan["hazards"])
        self._ages = len(hazards[0][0])  # this plan's buckets per zone (_plan_ages)
        self._table, self._lattice = plan_table(
            self._plan_problem,
            self._plan_gap,
            hazards,
            tuple(float(p) for p in plan["prices"]),
            int(plan["tick"]),
            horizon,
        )
        self._plan_tick = int(plan["tick"])  # planning-grid ticks
        self._plan_until = (self._plan_tick + horizon) * self._k  # trace ticks

    def state(self) -> dict[str, Any]:
        """Committed flag, the availability seen (one '0'/'1' string per zone) and the current
        plan's inputs; the plan itself is recomputed from them on load."""
        return {
            **super().state(),
            "past": ["".join("1" if x else "0" for x in seq) for seq in self._past],
            "plan": self._plan,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self._past = [[c == "1" for c in seq] for seq in state["past"]]
        self._plan = state.get("plan")
        if self._plan is None:
            self._plan_tick, self._table = -1, None
        else:
            self._load_plan()

    @staticmethod
    def _stranded(obs: Observation, zones: list[int] | tuple[int, ...]) -> bool:
        """Idle, every planned zone out of spot, and another zone has some: a zone that just
        lost its capacity is not waited for while spot is there elsewhere."""
        return (
            obs.market is Market.IDLE
            and not any(obs.available[z] for z in zones)
            and any(obs.available)
        )

    def _planned(self, obs: Observation) -> Decision:
        if self._plan_tick < 0 or obs.tick >= self._plan_until or self._stranded(obs, self._zones):
            self._replan(obs)
        lat: Lattice = self._lattice
        cell = waste_cell(lat, obs)
        if self._table is None or cell >= lat.cells:
            return Decision.ondemand()
        if obs.market is Market.IDLE:
            m = -1
        elif obs.market is Market.ONDEMAND:
            m = 0
        else:
            m = 1 + self._zones.index(obs.zone) if obs.zone in self._zones else -1
        combo = 0
        for z in self._zones:
            up = bool(obs.available[z])
            age = run_age(self._past[z], self._ages, self._k)
            combo = combo * 2 * self._ages + up * self._ages + age
        grid = obs if self._k == 1 else dataclasses.replace(obs, gap_s=self._plan_gap)
        row = obs.tick // self._k - self._plan_tick
        code = int(self._table[row, state_index(lat, m, grid), combo, cell])
        return decode(code, self._zones)

    # -- the guarded decision --------------------------------------------------------------
    def decide(self, obs: Observation) -> Decision:
        for z, seq in enumerate(self._past):
            seq.append(bool(obs.available[z]))
        if self._safety_net(obs):
            return Decision.ondemand()
        want = self._planned(obs)
        if not obs.safety_net or want.market is Market.ONDEMAND:
            return want
        # Too little slack to risk another changeover or an idle tick: keep what runs.
        if obs.market is Market.SPOT and obs.zone is not None:
            return Decision.spot(obs.zone)
        return Decision.ondemand()
