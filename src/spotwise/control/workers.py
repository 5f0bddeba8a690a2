"""Worker groups: N ordinary jobs that work on one thing together (the workers of a sweep or of
a batch-inference job), each with its own controller, relaunched after preemption like any job.

The group file is a job file with ``workers: N`` and the workload's own fields (for example
``output:`` or ``storage:``); every worker gets ``SPOTWISE_WORKER`` (``w0``, ``w1``...),
``SPOTWISE_WORKERS`` and the workload's variables in its environment, so its command can say
``--worker $SPOTWISE_WORKER``. ``budget_usd`` and ``deadline`` apply to the whole group: the
workers share the deadline, and when the group's spending reaches the budget every worker is
cancelled (it gets a notice and saves, as on any cancel).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from spotwise.checkpoint.durable import write_atomic
from spotwise.control.controller import Controller
from spotwise.control.ids import one_id, quoted
from spotwise.control.spec import JobSpec, parse_spec
from spotwise.control.store import JobState, Store, spotwise_home
from spotwise.control.submission import submit
from spotwise.errors import ConfigError, JobNotFoundError

MAX_WORKERS = 256


@dataclass
class GroupFile:
    """A parsed group file: the worker template, how many, and the workload's own fields."""

    spec: JobSpec
    workers: int
    fields: dict[str, Any]


@dataclass
class Group:
    id: str
    kind: str  # "sweep" | "infer"
    jobs: list[str]
    fields: dict[str, Any]
    budget_usd: float | None
    created_at: float
    stop_reason: str = ""

    @property
    def path(self) -> Path:
        return groups_dir() / f"{self.id}.json"

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.path, json.dumps(asdict(self), indent=1).encode())


def groups_dir() -> Path:
    return spotwise_home() / "groups"


def load_group_file(path: str | Path, kind: str, fields: Mapping[str, Any]) -> GroupFile:
    """Read a group file; ``fields`` are the workload's own keys with their defaults (None:
    required). Relative paths in them stay as written (the workload resolves them)."""
    p = Path(path)
    try:
        doc = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{kind} file {str(p)!r} does not exist", hint="check the path") from None
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"cannot read {kind} file {p}: {exc}") from None
    if not isinstance(doc, dict):
        raise ConfigError(f"{p}: expected a mapping of fields at the top level")
    workers = doc.pop("workers", 1)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= MAX_WORKERS:
        raise ConfigError(f"{p}: workers must be a whole number from 1 to {MAX_WORKERS}, "
                          f"got {workers!r}", hint="e.g. workers: 2")  # fmt: skip
    own: dict[str, Any] = {}
    for key, default in fields.items():
        value = doc.pop(key, default)
        if value is None:
            raise ConfigError(f"{p}: required field {key!r} is missing", hint=f"add {key}: ...")
        own[key] = value
    spec = parse_spec(doc, base_dir=p.resolve().parent, source=str(p))
    return GroupFile(spec, workers, own)


def submit_group(
    store: Store,
    kind: str,
    group_file: GroupFile,
    env: Mapping[str, str],
    spec_path: str | None = None,
    resolved: Mapping[str, Any] | None = None,
) -> Group:
    """Create one job per worker (checked and recorded by the controller's ``submit``), with the
    group's deadline and without a budget of its own: the group enforces the shared one.
    ``resolved`` are the workload's fields as resolved (absolute paths), kept in the record."""
    spec = group_file.spec
    jobs = []
    for i in range(group_file.workers):
        worker_env = {
            **spec.env,
            **env,
            "SPOTWISE_WORKER": f"w{i}",
            "SPOTWISE_WORKERS": str(group_file.workers),
        }
        worker = spec.model_copy(
            update={"name": f"{spec.name}-w{i}"[:63], "env": worker_env, "budget_usd": None}
        )
        jobs.append(submit(store, worker, spec_path).id)
    group = Group(
        f"{kind}-{jobs[0].rsplit('-', 1)[-1]}",
        kind,
        jobs,
        {**group_file.fields, **(resolved or {})},
        spec.budget_usd,
        time.time(),
    )
    group.save()
    return group


def load_group(group_id: str | None, kind: str) -> Group:
    """A group by id (the whole id or the start of exactly one), or the newest group of
    ``kind``."""
    found = sorted(groups_dir().glob(f"{kind}-*.json"), key=lambda p: p.stat().st_mtime)
    if group_id is None:
        if not found:
            raise JobNotFoundError(
                f"no {kind} has been started here",
                hint=f"start one with: spotwise {kind} FILE.yaml",
            )
        return _read_group(found[-1])
    named = one_id(group_id, [p.stem for p in reversed(found)], kind)
    if named is None:
        raise JobNotFoundError(
            f"no {kind} {quoted(group_id)}",
            hint=f"without an id, spotwise {kind} status shows the newest",
        )
    return _read_group(groups_dir() / f"{named}.json")


def _read_group(path: Path) -> Group:
    return Group(**json.loads(path.read_text()))


def group_cost_usd(store: Store, group: Group, now: float | None = None) -> float:
    now = time.time() if now is None else now
    return sum(a.cost_usd(now) for job in group.jobs for a in store.attempts(job))


def run_group(
    group: Group, *, poll_s: float = 0.5, on_update: Callable[[Group, Store], None] | None = None
) -> dict[str, JobState]:
    """Drive every worker's controller (one thread each) until all jobs end; stop them all
    when the group's budget is spent. Returns each job's final state.

    The controllers share one store, as a server's drivers do: its pool bounds the database
    connections (with a store per worker, 256 workers held up to 201 at once, past PostgreSQL's
    default limit of 100) and on SQLite its writers queue on one lock instead of on the file's."""
    states: dict[str, JobState] = {}
    errors: list[BaseException] = []
    store = Store()

    def drive(job_id: str) -> None:
        try:
            states[job_id] = Controller(store, job_id).run()
        except BaseException as exc:  # handed to the caller once every thread is done
            errors.append(exc)

    threads = [threading.Thread(target=drive, args=(j,), name=f"controller-{j}", daemon=True)
               for j in group.jobs]  # fmt: skip
    try:
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            if group.budget_usd is not None and not group.stop_reason:
                spent = group_cost_usd(store, group)
                if spent >= group.budget_usd:
                    group.stop_reason = f"budget ${group.budget_usd:.2f} spent (${spent:.2f})"
                    group.save()
                    for job in group.jobs:
                        if not store.job(job).state.terminal:
                            store.request_cancel(job)
            if on_update is not None:
                on_update(group, store)
            time.sleep(poll_s)
        if on_update is not None:
            on_update(group, store)
        for t in threads:
            t.join()
    finally:
        store.close()
    if errors:
        raise errors[0]
    return states
