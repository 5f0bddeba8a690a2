"""The omniscient offline optimum: the cheapest schedule of this model for a known trace.

Exact dynamic programming. The trick that keeps it exact and small: index states not by progress
but by *waste* (time spent idle or in changeovers). At tick boundary k, progress = k*G - waste,
and a run meets its deadline iff its total waste <= R - C. Waste only grows by G (an idle or a
whole changeover tick) or by the last part r = d - floor(d/G)*G of a changeover, so every
reachable waste is a multiple of u = gcd(G, r) (computed on a millisecond grid): the DP is exact
on that lattice, with (R - C)/u + 1 cells per state. States at a boundary are idle, or a market
(on-demand, spot in zone z) with a changeover phase j = ticks of the changeover already done
(j = J = ceil(d/G) means running). The backward recursion is vectorised over waste and over a
batch of start offsets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from spotwise.errors import ConfigError
from spotwise.market.policies.base import BasePolicy, Decision, Market, Observation, Problem

_HUGE = 1e30  # stands for +inf (a missed deadline) inside expectations
_MAX_CELLS = 400_000  # waste lattice size per state above which we refuse (a slow, huge DP)


@dataclass(frozen=True)
class Lattice:
    """The waste grid of one (G, d, R - C) setting."""

    gap_s: float
    changeover_s: float
    slack_s: float
    unit_s: float
    cells: int  # waste indices 0 .. cells-1 (cells == 0: infeasible)
    phases: int  # J + 1
    phase_left_s: tuple[float, ...]  # changeover still due at the start of a tick in phase j
    phase_waste: tuple[int, ...]  # waste (units) added by a tick in phase j (changeover part)

    @classmethod
    def of(cls, problem: Problem, gap_s: float) -> Lattice:
        d = problem.changeover_s
        slack = problem.deadline_s - problem.compute_s
        big_j = math.ceil(d / gap_s - 1e-9) if d > 0 else 0
        lefts = tuple(max(0.0, d - j * gap_s) for j in range(big_j + 1))
        steps = [gap_s] + [x for x in lefts if 0 < x < gap_s]
        ms = [round(x * 1000) for x in steps]
        if any(abs(m / 1000 - x) > 1e-6 for m, x in zip(ms, steps, strict=True)):
            raise ConfigError(
                "the optimal policy needs the tick and changeover on a millisecond grid",
                hint="round --changeover-h to whole seconds",
            )
        unit_ms = math.gcd(*ms)
        unit = unit_ms / 1000
        cells = math.floor(slack / unit + 1e-9) + 1 if slack >= 0 else 0
        if cells > _MAX_CELLS:
            raise ConfigError(
                f"the optimal DP would need {cells} waste cells per state (unit {unit:g} s)",
                hint="use a changeover that is a multiple of a larger number of seconds",
            )
        waste = tuple(round(gap_s / unit) if x >= gap_s else round(x / unit) for x in lefts)
        return cls(gap_s, d, slack, unit, cells, big_j + 1, lefts, waste)


def solve(
    problem: Problem,
    gap_s: float,
    available: np.ndarray,
    spot_prices: np.ndarray,
    *,
    keep_decisions: bool | int = False,
    transition: np.ndarray | None = None,
    first_tick: int = 0,
) -> tuple[np.ndarray, np.ndarray | None, Lattice]:
    """Minimum cost per run of a batch.

    ``available``: bool (batch, zones, ticks); ``spot_prices``: usd_per_hour, same shape.
    Returns (cost_usd per run, inf when even the optimum misses; decisions or None; lattice).
    Decisions (ticks, states, batch, cells) hold 0 idle, 1 on-demand, 2+z spot in zone z.

    With ``transition`` (batch x batch), the batch entries are instead the states of a Markov
    model of availability (entry a: spot as in ``available[a]``; next tick's entry drawn from
    row a): the result is then the expected cost from each state, minimised over policies that
    see only the present (the model the ``spotwise`` policy plans with).

    ``first_tick`` solves only boundaries first_tick .. ticks-1 (re-planning mid-run; the value
    returned is then at ``first_tick``); an int ``keep_decisions`` records only that many
    boundaries from ``first_tick`` (memory).
    """
    lat = Lattice.of(problem, gap_s)
    b, zones, ticks = available.shape
    if lat.cells == 0:
        return np.full(b, np.inf), None, lat
    g, c_s, u, cells = gap_s, problem.compute_s, lat.unit_s, lat.cells
    phases = lat.phases
    markets = 1 + zones  # on-demand, then spot per zone
    n_states = 1 + markets * phases  # 0: idle; 1 + m*phases + j: market m in phase j
    g_units = round(g / u)
    # Value arrays carry an always-+inf tail, so "waste grows by s" is the view v[..., s:s+cells]
    # (more waste than the slack allows = missed deadline = infinite cost).
    width = cells + g_units
    later = np.full((n_states, b, width), np.inf)  # at boundary `ticks`: unfinished = missed
    now = np.full((n_states, b, width), np.inf)
    execute = np.empty((n_states, b, cells))  # cost-to-go of spending tick k in each state
    ex_idle = execute[0]
    ex = execute[1:].reshape(markets, phases, b, cells)
    w_s = np.arange(cells) * u
    rates, barred = _rates(problem, available, spot_prices)
    kept = _kept(keep_decisions, ticks - first_tick)
    decisions = np.zeros((kept, n_states, b, cells), np.int8) if kept else None
    for k in range(ticks - 1, first_tick - 1, -1):
        _execute_costs(lat, c_s, k, later, rates[k], ex_idle, ex, w_s)
        ex += barred[k]
        best = np.minimum(ex_idle, ex[:, 0].min(axis=0))
        now[0, :, :cells] = best
        np.minimum(best, ex, out=now[1:].reshape(markets, phases, b, width)[..., :cells])
        if decisions is not None and k - first_tick < kept:
            _record_decisions(decisions[k - first_tick], ex_idle, ex, best)
        if transition is not None:  # expected value over the next tick's availability
            _expect(transition, now[:, :, :cells])
        later, now = now, later
    return later[0, :, 0] * problem.nodes, decisions, lat


def _rates(
    problem: Problem, available: np.ndarray, spot_prices: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Per tick, the usd per second of each market (ticks x markets x batch) and what using it
    adds: 0, or +inf where spot is unavailable (shaped to add to the execute costs)."""
    b, zones, ticks = available.shape
    markets = 1 + zones
    rates = np.empty((ticks, markets, b))
    rates[:, 0] = problem.ondemand_price_usd_per_hour / 3600.0
    rates[:, 1:] = np.transpose(spot_prices, (2, 1, 0)) / 3600.0
    barred = np.zeros((ticks, markets, 1, b, 1))
    barred[:, 1:, 0, :, 0] = np.where(np.transpose(available, (2, 1, 0)), 0.0, np.inf)
    return rates, barred


def _kept(keep_decisions: bool | int, boundaries: int) -> int:
    """How many of ``boundaries`` boundaries' decisions to record (see :func:`solve`)."""
    kept = 0 if not keep_decisions else boundaries
    if not isinstance(keep_decisions, bool):
        kept = min(kept, keep_decisions)
    return kept


def _execute_costs(
    lat: Lattice,
    c_s: float,
    k: int,
    later: np.ndarray,
    rates: np.ndarray,
    ex_idle: np.ndarray,
    ex: np.ndarray,
    w_s: np.ndarray,
) -> None:
    """Fill the cost-to-go of spending tick ``k`` idle (``ex_idle``: batch x cells) or in each
    market and phase (``ex``: markets x phases x batch x cells), from the values at boundary
    k+1 (``later``) and each market's usd per second (``rates``: markets x batch); spot's
    unavailability is added by the caller."""
    g, u, cells = lat.gap_s, lat.unit_s, lat.cells
    markets, phases, b = ex.shape[:3]
    big_j, g_units = phases - 1, round(g / u)
    full = sum(left >= g for left in lat.phase_left_s)  # phases 0..full-1 are whole changeover
    nxt = later[1:].reshape(markets, phases, b, later.shape[-1])
    rate = rates[:, :, None]  # markets x batch x 1
    ex_idle[:] = later[0, :, g_units : g_units + cells]
    if full:
        np.add(
            nxt[:, 1 : full + 1, :, g_units : g_units + cells],
            (rate * g)[:, None],
            out=ex[:, :full],
        )
    for j in range(full, phases):  # the tick that ends the changeover, and running
        left = lat.phase_left_s[j]
        shift = lat.phase_waste[j]
        e = ex[:, j]
        np.add(nxt[:, min(j + 1, big_j), :, shift : shift + cells], rate * g, out=e)
        last = math.floor((g - left - (c_s - k * g)) / u + 1e-9)
        if last >= 0:  # the job can finish in this tick: cells with little waste
            n = min(last + 1, cells)
            e[:, :, :n] = rate * (left + c_s - k * g + w_s[:n])
            if cells - shift < n:  # ... but not after the deadline
                e[:, :, cells - shift : n] = np.inf


def _record_decisions(
    out: np.ndarray, ex_idle: np.ndarray, ex: np.ndarray, best: np.ndarray
) -> None:
    """Write one boundary's best move from each state into ``out`` (states x batch x cells):
    0 idle, 1 on-demand, 2+z spot in zone z; a market state stays where it is when that is
    best (ties included), else moves as from idle."""
    markets, phases, b, cells = ex.shape
    codes = np.arange(1, markets + 1, dtype=np.int8)[:, None, None, None]
    out[0] = np.concatenate([ex_idle[None], ex[:, 0]]).argmin(axis=0)
    out[1:] = np.where(ex <= best, codes, out[0]).reshape(markets * phases, b, cells)


def _expect(transition: np.ndarray, values: np.ndarray) -> None:
    """Replace ``values`` (states x batch x cells) in place by their expectation over the next
    tick's availability state (``transition``: batch x batch)."""
    # +inf as a huge finite number, so that a zero probability times it stays 0
    mixed = np.matmul(transition, np.minimum(values, _HUGE))
    values[:] = np.where(mixed >= _HUGE * 1e-12, np.inf, mixed)


def optimal_costs(
    problem: Problem,
    available: np.ndarray,
    spot_prices: np.ndarray | float,
    gap_s: float,
    starts: list[int],
    ticks: int,
    *,
    batch: int = 64,
) -> np.ndarray:
    """Optimal cost of a run from each start tick (zones x trace ticks in, one cost per start)."""
    prices = np.broadcast_to(np.asarray(spot_prices, dtype=float), available.shape)
    out = []
    for i in range(0, len(starts), batch):
        chunk = starts[i : i + batch]
        av = np.stack([available[:, s : s + ticks] for s in chunk])
        pr = np.stack([prices[:, s : s + ticks] for s in chunk])
        out.append(solve(problem, gap_s, av, pr)[0])
    return np.concatenate(out) if out else np.zeros(0)


class OptimalPolicy(BasePolicy):
    """Replays the DP's schedule; the simulator calls ``plan`` with the run's future first."""

    name = "optimal"

    def plan(self, available: np.ndarray, spot_prices: np.ndarray) -> None:
        cost, decisions, lat = solve(
            self.problem, self.gap_s, available[None], spot_prices[None], keep_decisions=True
        )
        self.expected_cost_usd = float(cost[0])
        self._decisions = decisions
        self._lattice = lat

    def decide(self, obs: Observation) -> Decision:
        lat, table = self._lattice, self._decisions
        cell = waste_cell(lat, obs)
        if table is None or cell >= lat.cells:  # infeasible even for the optimum
            return Decision.ondemand()
        m = (
            -1
            if obs.market is Market.IDLE
            else 0
            if obs.market is Market.ONDEMAND
            else 1 + (obs.zone or 0)
        )
        return decode(int(table[obs.tick, state_index(lat, m, obs), 0, cell]))


def waste_cell(lat: Lattice, obs: Observation) -> int:
    """The lattice cell of the observed waste (time so far minus progress)."""
    return max(0, round((obs.elapsed_s - obs.progress_s) / lat.unit_s))


def state_index(lat: Lattice, market: int, obs: Observation) -> int:
    """DP state of an observation: 0 idle, else market m (0 on-demand, 1+z spot) and phase."""
    if market < 0:
        return 0
    if obs.changeover_left_s <= 1e-9:
        j = lat.phases - 1
    else:
        j = math.ceil((obs.changeover_s - obs.changeover_left_s) / obs.gap_s - 1e-9)
    return 1 + market * lat.phases + j


def decode(code: int, zones: tuple[int, ...] | None = None) -> Decision:
    if code == 0:
        return Decision.idle()
    if code == 1:
        return Decision.ondemand()
    return Decision.spot(code - 2 if zones is None else zones[code - 2])
