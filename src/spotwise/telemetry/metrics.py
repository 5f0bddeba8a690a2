"""The controller's ``/metrics``: every job in the store, in Prometheus' text format.

Read at scrape time from the store (SQLite) and each job's run directory through
:func:`~spotwise.telemetry.jobview.job_view`, so the figures are the ones ``spotwise status``,
the dashboard and the report show. Names follow Prometheus' conventions: base units in the name
(``_seconds``, ``_usd``), ``_total`` for counters, one label per dimension.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

from spotwise.control.store import JobState, Store
from spotwise.telemetry.jobview import JobView, job_view
from spotwise.telemetry.ledger import KINDS


def deadline_slack_s(view: JobView) -> float | None:
    """Time to the deadline minus the compute still to do (negative: it will be late)."""
    spec = view.spec
    if spec.deadline_s is None or spec.expected_runtime_s is None or view.job.state.terminal:
        return None
    remaining = max(0.0, spec.expected_runtime_s - view.ledger.seconds["useful"])
    return view.job.created_at + spec.deadline_s - view.now - remaining


class StoreCollector:
    """A ``prometheus_client`` collector over a job store."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.clock = clock

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        now = self.clock()
        views = [job_view(self.store, job, now) for job in self.store.jobs()]
        states = Counter(v.job.state.value for v in views)
        by_state = GaugeMetricFamily("spotwise_jobs", "Jobs by state", labels=["state"])
        for state in JobState:
            by_state.add_metric([state.value], states.get(state.value, 0))
        yield by_state

        job = ["job", "name"]
        families: dict[str, Any] = {
            "attempts": CounterMetricFamily(
                "spotwise_job_attempts", "Attempts launched", labels=job
            ),
            "preemptions": CounterMetricFamily(
                "spotwise_job_preemptions",
                "Attempts ended by a preemption or machine loss",
                labels=job,
            ),
            "cost": CounterMetricFamily(
                "spotwise_job_cost_usd", "Dollars billed so far", labels=job
            ),
            "ondemand": CounterMetricFamily(
                "spotwise_job_ondemand_cost_usd",
                "Dollars the same machine hours would cost on-demand",
                labels=job,
            ),
            "savings": GaugeMetricFamily(
                "spotwise_job_savings_usd",
                "Dollars saved against an on-demand-only run (goodput ledger)",
                labels=job,
            ),
            "goodput": CounterMetricFamily(
                "spotwise_job_goodput_seconds",
                "Wall seconds by kind: useful, lost, restore, changeover, idle",
                labels=[*job, "kind"],
            ),
            "slack": GaugeMetricFamily(
                "spotwise_job_deadline_slack_seconds",
                "Seconds to the deadline minus compute still to do",
                labels=job,
            ),
        }
        for v in views:
            key = [v.job.id, v.job.name]
            s = v.summary
            families["attempts"].add_metric(key, len(s["attempts"]))
            families["preemptions"].add_metric(key, s["preemptions"])
            families["cost"].add_metric(key, s["cost_usd"])
            families["ondemand"].add_metric(key, s["ondemand_cost_usd"])
            families["savings"].add_metric(key, v.ledger.savings_usd)
            for kind in KINDS:
                families["goodput"].add_metric([*key, kind], v.ledger.seconds[kind])
            slack = deadline_slack_s(v)
            if slack is not None:
                families["slack"].add_metric(key, slack)
        yield from families.values()


def render(store: Store) -> bytes:
    """The text exposition of :class:`StoreCollector` (served at ``/metrics``)."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    return generate_latest(registry)
