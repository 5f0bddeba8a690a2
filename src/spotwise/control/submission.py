"""Submitting a job: check it can run (provider reachable, world size, budget, the policy's
terms), pack its workdir and record it; and ``launch --dry-run``'s view of its first attempt."""

from __future__ import annotations

import time
from typing import Any

from spotwise.control.decisions import estimate_cost_usd
from spotwise.control.launching import launch_request
from spotwise.control.planning import build_driver, plans
from spotwise.control.providers import Placement, Provider, make_provider
from spotwise.control.providers.base import checkpoint_dir
from spotwise.control.spec import JobSpec, stored_spec
from spotwise.control.store import Job, Store, spotwise_home
from spotwise.control.workdir import ARCHIVES
from spotwise.control.workdir_home import submit_workdir
from spotwise.errors import BudgetError, ConfigError


def provider_for(job: Job) -> Provider:
    spec = stored_spec(job.id, job.spec)
    return make_provider(
        spec.provider.name,
        spec.provider.options,
        epoch=job.created_at,
        instance_type=spec.resources.instance_type,
        resources=spec.resources,
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
