"""What one attempt of a job runs: its command, environment, directories and placement, and
its launch on as many machines as the market has (``min_nodes``)."""

from __future__ import annotations

import os
import string
import sys
from dataclasses import replace
from pathlib import Path

from spotwise.control.heartbeat import heartbeat_location, machine_env
from spotwise.control.providers import Handle, LaunchRequest, Placement, Provider
from spotwise.control.providers.base import checkpoint_dir
from spotwise.control.secret_refs import file_values
from spotwise.control.spec import JobSpec
from spotwise.control.store import Store
from spotwise.control.workdir import CodeArchive, split_workdir
from spotwise.errors import CapacityError


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


def launch_sized(
    provider: Provider, store: Store, req: LaunchRequest, min_nodes: int | None
) -> Handle:
    """Launch on the job's ``nodes``, or, with ``min_nodes``, on the most machines the
    market has right now (the run resumes at the smaller world size)."""
    fewest = min_nodes or req.nodes
    nodes = req.nodes
    while True:
        try:
            handle = provider.launch(replace(req, nodes=nodes))
        except CapacityError as exc:
            if nodes <= fewest:
                raise
            store.event(req.job_id, "capacity", f"{exc.message}; trying {nodes - 1}")
            nodes -= 1
            continue
        if nodes < req.nodes:
            pricing = provider.prices.of(req.placement)
            store.update_attempt(
                req.job_id,
                req.n,
                usd_per_hour=pricing.usd_per_hour * nodes,
                ondemand_usd_per_hour=pricing.ondemand_usd_per_hour * nodes,
            )
            store.event(
                req.job_id,
                "nodes",
                f"attempt {req.n} runs on {nodes} of {req.nodes} nodes (min_nodes "
                f"{fewest}): the market lacks capacity for {req.nodes}",
            )
        return handle
