"""``aws``: each attempt is one EC2 instance (spot one-time + terminate, or on-demand), or, with
``nodes: N``, N instances in a cluster placement group that meet through torch's rendezvous.

The instance boots with a cloud-init user-data script (``user_data``) that runs the job's command
with ``SPOTWISE_CHECKPOINT_DIR=s3://...`` and, when the command ends, writes the attempt's exit
record (and its output) under the job's S3 prefix before the machine shuts itself down
(``InstanceInitiatedShutdownBehavior=terminate``). The user-data carries no credentials: the
instance profile supplies them. Status comes from ``DescribeInstances`` (state and
``StateReason``: spot interruption, user, error) plus that exit record, which is what tells "the
command exited 75 after saving" from "the machine was taken away".

Everything is tagged ``spotwise:job`` / ``spotwise:attempt`` (instances and their volumes), which
is how ``find`` lists a job's machines after a controller crash, so the controller can adopt the
one it lost and terminate the rest.

A multi-node attempt launches rank 0 first and passes its private address to the others in
their user-data; all start or none stays (a capacity error on any node terminates the ones up).
Each node runs ``spotwise.runtime.launch`` with its node rank and reports its own exit record
(``attempts/<n>/<launch>/node-<k>``: ``<launch>`` is new for every launch, so the record of a
node terminated by an all-or-nothing rollback is never read as the record of the same attempt's
next launch in another zone); the loss of any node ends the attempt as on ``sim``
(:func:`~spotwise.control.providers.process.group_status`: the others are stopped, their
ranks save and exit 75). Its placement and security groups are in ``aws_cluster``.

Capacity errors become :class:`CapacityError` (the controller
tries the next placement); throttling and 5xx are retried with the S3 backend's backoff policy.

boto3 is imported only when a provider is built (``pip install 'spotwise[aws]'``). Endpoints and
credentials come the AWS way (``AWS_ENDPOINT_URL``, profiles, env vars), which is how the tests
point it at a loopback moto server.
"""

from __future__ import annotations

import difflib
import random
import re
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from pydantic import Field, model_validator

from spotwise.control.pricing import catalog_usd_per_hour, region_of
from spotwise.control.providers import aws_cluster, cloud_nodes
from spotwise.control.providers.aws_placement import AwsPlacement, choose_placement, settle_zones
from spotwise.control.providers.base import (
    MARKETS,
    AttemptStatus,
    CheckpointHome,
    Features,
    Handle,
    LaunchRequest,
    NoticeKind,
    Options,
    Phase,
    Prices,
    Pricing,
    parse_options,
)
from spotwise.control.providers.remote_boot import boot_script, copy_log, exit_record
from spotwise.errors import (
    CapacityError,
    ConfigError,
    ProviderError,
    ProviderUnavailableError,
    TransientProviderError,
)
from spotwise.registry import require

if TYPE_CHECKING:
    from spotwise.control.spec import Resources

T = TypeVar("T")

JOB_TAG, ATTEMPT_TAG = "spotwise:job", "spotwise:attempt"
# a node of a multi-node attempt: its rank, the attempt's size, and which launch of the attempt
RANK_TAG, NODES_TAG, LAUNCH_TAG = "spotwise:rank", "spotwise:nodes", "spotwise:launch"
# RunInstances errors that mean "no machine of that kind here, now": try another placement.
CAPACITY_CODES = frozenset({
    "InsufficientInstanceCapacity", "SpotMaxPriceTooLow", "MaxSpotInstanceCountExceeded",
    "Unsupported", "InsufficientHostCapacity", "InsufficientCapacity",
})  # fmt: skip
# Errors that no retry fixes and that name a setting: raised at preflight before paying.
QUOTA_CODES = frozenset({"VcpuLimitExceeded", "InstanceLimitExceeded"})
PRICE_FRESH_S = 7 * 86400.0  # an older observed spot price is not used for estimates
LIVE_STATES = ["pending", "running", "stopping", "stopped", "shutting-down"]
# Never written into user-data: the instance profile gives the instance its own credentials.
_SECRET_ENV = re.compile(r"^AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN|SECURITY_TOKEN)$")


class AwsOptions(Options):
    region: str | None = None  # default: the advisor's choice for the job's resources
    regions: list[str] = Field(default_factory=list)  # several: the job spans them (not region)
    s3: str = Field(pattern=r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")
    zones: list[str] = Field(default_factory=list)  # default: the keys of subnets, or <region>a
    subnets: dict[str, str] = Field(default_factory=dict)  # zone -> subnet id
    instance_type: str | None = None  # default: resources.instance_type, else advised
    image_id: str | dict[str, str] | None = None  # one AMI, or region -> AMI
    launch_template: dict[str, str] | None = None  # {"id" | "name": ..., "version": ...}
    security_group_ids: list[str] | dict[str, list[str]] = Field(default_factory=list)
    instance_profile: str | None = None  # name, or an ARN
    key_name: str | None = None
    root_device: str | None = None  # default: the AMI's RootDeviceName
    root_volume_gb: int = Field(default=100, ge=8, le=16384)
    encrypted: bool = True
    kms_key_id: str | None = None
    spot_max_usd_per_hour: float | None = Field(default=None, gt=0)
    spot_usd_per_hour: float | None = Field(default=None, ge=0)  # default: the catalog's
    ondemand_usd_per_hour: float | None = Field(default=None, ge=0)
    workdir: str | None = None  # on the instance; default: the job's workdir
    setup: list[str] = Field(default_factory=list)  # shell lines run before the command
    python: str = "python3"
    poll_s: float = Field(default=5.0, gt=0)
    grace_s: float = Field(default=120.0, ge=0)  # EC2's two-minute spot notice

    @model_validator(mode="after")
    def _one_image(self) -> AwsOptions:
        if (self.image_id is None) == (self.launch_template is None):
            raise ValueError("give exactly one of image_id and launch_template")
        return self


def _transition_time(reason: str) -> float | None:
    """``User initiated (2026-12-01 10:00:49 GMT)`` -> that instant (EC2 writes it so)."""
    match = re.search(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)", reason)
    if match is None:
        return None
    when = datetime.strptime(match.group(1), "%Y-%m-%d %H:%M:%S")
    return when.replace(tzinfo=timezone.utc).timestamp()


def _code(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    return str(((response or {}).get("Error") or {}).get("Code", "")) if response else ""


def _message(exc: BaseException) -> str:
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        return str((response.get("Error") or {}).get("Message", "")) or str(exc)
    return str(exc)


def advise_placement(
    opts: AwsOptions, instance_type: str | None, resources: Resources | None
) -> AwsPlacement:
    """What the job file pins, the rest from the advisor over the shipped catalog: the same
    answer at submit and in every later controller (no live input), so attempts agree."""
    from spotwise.market import load_catalog, load_interruption_model

    return choose_placement(
        gpu=resources.gpu if resources else None,
        gpu_count=resources.gpu_count if resources else 0,
        cpus=resources.cpus if resources else 1,
        instance_type=opts.instance_type or instance_type,
        region=opts.region,
        regions=tuple(opts.regions),
        zones=tuple(opts.zones or opts.subnets),
        market="spot",
        catalog=load_catalog(),
        model=load_interruption_model(),
    )


def _check_regions(opts: AwsOptions, session: Any) -> None:
    """Every region the job file names is one of botocore's own region table (no call
    needed), or the error names the key, the closest names and the regions there are."""
    known = sorted(
        {
            r
            for part in ("aws", "aws-cn", "aws-us-gov")
            for r in session.get_available_regions("ec2", part)
        }
    )
    key = "provider.aws.regions" if opts.regions else "provider.aws.region"
    for region in opts.regions or ([opts.region] if opts.region else []):
        if region not in known:
            close = difflib.get_close_matches(region, known, n=3)
            raise ConfigError(
                f"{key}: unknown region {region!r}",
                hint=(f"did you mean {', '.join(close)}? " if close else "")
                + f"regions: {', '.join(known)}",
            )


class AwsProvider:
    name = "aws"
    Options = AwsOptions

    def __init__(
        self,
        options: dict[str, Any],
        *,
        epoch: float,
        instance_type: str | None,
        preflight: bool = False,
        resources: Resources | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.opts = parse_options(AwsOptions, self.name, options)
        boto3 = require("boto3", "aws", "the aws provider")
        config = require("botocore.config", "aws", "the aws provider").Config(
            retries={"total_max_attempts": 1}, connect_timeout=10, read_timeout=60
        )
        _check_regions(self.opts, boto3.session.Session())
        self.placement = advise_placement(self.opts, instance_type, resources)
        self.instance_type, self.region = self.placement.instance_type, self.placement.region
        self.regions = self.placement.regions  # the zones' regions; self.region is the first
        zones = self.placement.zones
        stray = sorted(set(self.opts.subnets) - set(zones))
        if stray:
            raise ConfigError(f"provider.aws.subnets: zones {stray} are not in provider.aws.zones")
        from spotwise.retry import RetryPolicy
        from spotwise.storage.s3 import parse_s3_uri

        self.bucket, self.prefix = parse_s3_uri(self.opts.s3)
        self.features = self._features(zones)
        self.retry = RetryPolicy.from_env()
        self._sleep, self._rand = sleep, random.Random()
        # one EC2 client per region (an instance is launched, watched and found in its zone's
        # region); the job's bucket is reached from the first region
        self._ec2 = {
            r: boto3.session.Session(region_name=r).client("ec2", config=config)
            for r in self.regions
        }
        self.s3 = boto3.session.Session(region_name=self.region).client("s3", config=config)
        self._images = self._per_region("image_id", self.opts.image_id)
        self._groups = self._per_region("security_group_ids", self.opts.security_group_ids)
        if preflight:
            self._preflight()
            self._record_spot_prices()
        observed = self._observed_spot_prices()
        self.prices = Prices(
            {
                (m, z): Pricing(self._price(m, z, observed), self._price("on-demand", z, {}))
                for m in MARKETS
                for z in self.features.zones
            }
        )

    def _features(self, zones: tuple[str, ...]) -> Features:
        """Spot with IMDS notices, remote multi-node machines, checkpoints in the job's bucket."""
        return Features(
            zones=zones,
            spot=True,
            notice=NoticeKind.AWS_IMDS,
            poll_s=self.opts.poll_s,
            grace_s=self.opts.grace_s,
            same_host=False,
            multi_node=True,
            checkpoints=CheckpointHome(
                default=f"{self.job_uri('{job_id}')}/checkpoint",
                durable=("s3://",),
                hint="give checkpoint_dir as an s3:// URI, or leave it out: each job then "
                f"checkpoints to {self.opts.s3.rstrip('/')}/<job id>/checkpoint",
            ),
        )

    def _price(self, market: str, zone: str, observed: dict[str, float]) -> float:
        """Given in the job file, else the zone's recent spot price, else the catalog's."""
        given = self.opts.spot_usd_per_hour if market == "spot" else self.opts.ondemand_usd_per_hour
        if given is not None:
            return given
        if market == "spot" and zone in observed:
            return observed[zone]
        assert self.instance_type is not None
        return catalog_usd_per_hour(self.instance_type, zone, market)

    def _record_spot_prices(self) -> None:
        """At submit: DescribeSpotPriceHistory of the last day into the price store (which the
        advisor and ``spotwise prices`` read too)."""
        from spotwise.market.prices import PriceStore, ingest
        from spotwise.market.sources.aws import AwsSpotPriceSource

        assert self.instance_type is not None
        source = AwsSpotPriceSource(
            regions=list(self.regions),
            instance_types=[self.instance_type],
            start=datetime.now(timezone.utc) - timedelta(days=1),
        )
        with PriceStore() as store:
            ingest(store, source)

    def _observed_spot_prices(self) -> dict[str, float]:
        """The price store's newest spot price per zone, if seen within PRICE_FRESH_S."""
        from spotwise.market.prices import PriceStore

        assert self.instance_type is not None
        with PriceStore() as store:
            rows = store.latest([("aws", self.instance_type)])
        fresh = time.time() - PRICE_FRESH_S
        return {
            r.zone: r.usd_per_hour
            for r in rows
            if r.region in self.regions and r.market == "spot" and r.zone and r.ts >= fresh
        }

    # --- calls -----------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        """One EC2/S3 call: retry throttling/5xx with backoff, translate the final failure."""
        from spotwise.storage.s3 import Failure, classify

        attempt = 1
        while True:
            try:
                return fn()
            except Exception as exc:  # vendor errors are translated right here, at the edge
                code, kind = _code(exc), classify(exc)
                if code in CAPACITY_CODES:
                    raise CapacityError(
                        f"{what}: {code}: {_message(exc)}",
                        hint="another zone or market may have capacity",
                    ) from exc
                if kind is Failure.RETRY and attempt < self.retry.max_attempts:
                    self._sleep(self.retry.delay_s(attempt, self._rand.random()))
                    attempt += 1
                    continue
                if kind is Failure.RETRY:
                    raise TransientProviderError(
                        f"{what}: {code or type(exc).__name__} after "
                        f"{attempt} tries: {_message(exc)}"
                    ) from exc
                if kind is Failure.PERMISSION or code in ("AuthFailure", "UnauthorizedOperation"):
                    raise ProviderUnavailableError(
                        f"{what}: AWS refused the credentials: {code or type(exc).__name__}: "
                        f"{_message(exc)}",
                        hint="configure credentials (AWS_PROFILE, instance role, or env vars) "
                        "with the IAM policy in docs/control.md",
                    ) from exc
                raise ProviderError(
                    f"{what}: {code or type(exc).__name__}: {_message(exc)}"
                ) from exc

    def _preflight(self) -> None:
        """Check credentials, zones, subnets, instance type, bucket and quota before any
        launch, in every region of the job (the names were checked at construction)."""
        o = self.opts
        pinned = bool(o.zones or o.subnets)
        zones: set[str] = set()
        offered: set[str] = set()
        for region in self.regions:
            have, has_type = self._region_zones(region, pinned)
            zones |= have
            offered |= has_type
        if not pinned:  # zones left open: the ones here that have the type, advised first
            kept = settle_zones(self.features.zones, offered & zones)
            if not kept:
                raise ConfigError(
                    f"instance type {self.instance_type!r} is offered in no zone of "
                    f"{', '.join(self.regions)}",
                    hint="pin provider.aws.region (or provider.aws.instance_type) to a place "
                    "that has it (aws ec2 describe-instance-type-offerings)",
                )
            self.features = replace(self.features, zones=kept)
            self.placement = replace(self.placement, zones=kept, region=region_of(kept[0]))
            self.regions = self.placement.regions  # (the bucket stays reached from the first)
        missing = [z for z in self.features.zones if z not in offered]
        if missing:
            raise ConfigError(
                f"instance type {self.instance_type!r} is not offered in {missing}",
                hint="check resources.instance_type and provider.aws.zones "
                "(aws ec2 describe-instance-type-offerings)",
            )
        try:
            self._call("HeadBucket", lambda: self.s3.head_bucket(Bucket=self.bucket))
        except ProviderError as exc:
            raise ConfigError(
                f"provider.aws.s3: bucket {self.bucket!r} is not usable: {exc.message}",
                hint="create it or fix provider.aws.s3",
            ) from None
        for region in self.regions:  # quotas, images and groups are per region
            first = next(z for z in self.features.zones if region_of(z) == region)
            self._dry_run(first)

    def _region_zones(self, region: str, pinned: bool) -> tuple[set[str], set[str]]:
        """The zones ``region`` has and those of them that offer the instance type, after
        checking the job's pinned zones and subnets there."""
        o, ec2 = self.opts, self._ec2[region]
        zones = {
            z["ZoneName"]
            for z in self._call("DescribeAvailabilityZones", ec2.describe_availability_zones)[
                "AvailabilityZones"
            ]
        }
        mine = [z for z in self.features.zones if region_of(z) == region]
        bad = [z for z in mine if z not in zones]
        if bad and pinned:
            raise ConfigError(
                f"provider.aws.zones: {bad} are not zones of {region}",
                hint=f"zones of {region}: {', '.join(sorted(zones))}",
            )
        subnets = {z: sub for z, sub in o.subnets.items() if region_of(z) == region}
        if subnets:
            found = self._call(
                "DescribeSubnets",
                lambda: ec2.describe_subnets(SubnetIds=list(subnets.values())),
            )["Subnets"]
            where = {s["SubnetId"]: s["AvailabilityZone"] for s in found}
            for zone, subnet in subnets.items():
                if where.get(subnet) != zone:
                    raise ConfigError(
                        f"provider.aws.subnets.{zone}: subnet {subnet} is in "
                        f"{where.get(subnet, 'no zone of ' + region)}, not {zone}",
                        hint="map each zone to a subnet in that zone",
                    )
        offered = {
            x["Location"]
            for x in self._call(
                "DescribeInstanceTypeOfferings",
                lambda: ec2.describe_instance_type_offerings(
                    LocationType="availability-zone",
                    Filters=[{"Name": "instance-type", "Values": [self.instance_type]}],
                ),
            )["InstanceTypeOfferings"]
        }
        return zones, offered

    def _dry_run(self, zone: str) -> None:
        """RunInstances with DryRun in ``zone``: AWS checks permissions, the image and the
        quota without starting anything."""
        args = self._run_args(f"spotwise-preflight-{time.time_ns()}", "on-demand", zone, "", {})
        ec2 = self._ec2[region_of(zone)]

        def dry_run() -> None:
            try:
                ec2.run_instances(DryRun=True, **args)
            except Exception as exc:
                if _code(exc) != "DryRunOperation":
                    raise

        try:
            self._call("RunInstances (dry run)", dry_run)
        except CapacityError:
            pass  # capacity comes and goes; the launch tries each placement in turn
        except ProviderError as exc:
            quota = [c for c in QUOTA_CODES if c in exc.message]
            if quota:
                raise ConfigError(
                    f"the EC2 quota stops {self.instance_type} in {region_of(zone)}: {exc.message}",
                    hint="request a limit increase (Service Quotas) or pick a "
                    "smaller resources.instance_type",
                ) from None
            raise

    # --- the protocol ----------------------------------------------------------------------
    def launch(self, req: LaunchRequest) -> Handle:
        leaked = sorted(k for k in req.env if _SECRET_ENV.match(k))
        if leaked:
            raise ConfigError(
                f"env {leaked} would be written into the instance's user-data",
                hint="remove them from the job's env: the instance profile "
                "(provider.aws.instance_profile) gives the instance credentials",
            )
        zone = req.placement.zone or self.features.zones[0]
        handle = {
            "n": req.n,
            "job": req.job_id,
            "zone": zone,
            "region": region_of(zone),
            "market": req.placement.market,
            "log": str(req.log_path),
        }
        if req.nodes > 1:
            return {**handle, **self._launch_nodes(req, zone)}
        tags = {JOB_TAG: req.job_id, ATTEMPT_TAG: str(req.n), "Name": req.key}
        instance = self._run(req, zone, self.user_data(req), tags, req.key)
        return {**handle, "id": instance["InstanceId"]}

    def _run(
        self,
        req: LaunchRequest,
        zone: str,
        user_data: str,
        tags: dict[str, str],
        name: str,
        cluster: tuple[str, list[str]] | None = None,
    ) -> dict[str, Any]:
        """RunInstances of one instance; ``cluster``: its placement group and security groups."""
        token = f"{name}-{req.placement.market}-{zone}"[-64:]  # RunInstances idempotency
        args = self._run_args(token, req.placement.market, zone, user_data, tags, cluster)
        ec2 = self._ec2[region_of(zone)]
        out = self._call("RunInstances", lambda: ec2.run_instances(**args))
        return dict(out["Instances"][0])

    def _launch_nodes(self, req: LaunchRequest, zone: str) -> Handle:
        """The attempt's ``req.nodes`` instances as one launch (``cloud_nodes.start_nodes``:
        rank 0 first, all or none), all in the job's placement group."""
        region = region_of(zone)
        ec2, job = self._ec2[region], {JOB_TAG: req.job_id}
        vpc = aws_cluster.vpc_of(self._call, ec2, self.opts.subnets.get(zone), region)
        groups = self._groups.get(region) or [aws_cluster.default_group(self._call, ec2, vpc)]
        cluster = (
            aws_cluster.placement_group(self._call, ec2, req.job_id, zone, job),
            [*groups, aws_cluster.security_group(self._call, ec2, req.job_id, vpc, job)],
        )

        def start(k: int, endpoint: str, launch: str) -> tuple[str, str]:
            tags = {
                JOB_TAG: req.job_id,
                ATTEMPT_TAG: str(req.n),
                RANK_TAG: str(k),
                NODES_TAG: str(req.nodes),
                LAUNCH_TAG: launch,
                "Name": f"{req.key}-node-{k}",
            }
            user_data = self.user_data(req, node=k, endpoint=endpoint, launch=launch)
            instance = self._run(req, zone, user_data, tags, f"{req.key}-{launch}-{k}", cluster)
            return instance["InstanceId"], instance["PrivateIpAddress"]

        return cloud_nodes.start_nodes(
            req, start, lambda node: self.terminate({**node, "region": region})
        )

    def _client(self, handle: Handle) -> Any:
        """The EC2 client of the region a handle's instance or volume is in (handles stored
        before jobs spanned regions name only their zone, or nothing: the first region)."""
        zone = handle.get("zone")
        return self._ec2[handle.get("region") or (region_of(zone) if zone else self.region)]

    def status(self, handle: Handle) -> AttemptStatus:
        if "nodes" in handle:
            return cloud_nodes.nodes_status(
                handle, self.status, self.terminate, self.features.grace_s
            )
        ec2 = self._client(handle)
        if "cluster" in handle:  # the job's placement or security group: "up" while it exists
            there = aws_cluster.exists(self._call, ec2, handle["cluster"], handle["id"])
            return AttemptStatus(Phase.STARTING if there else Phase.LOST, detail=handle["cluster"])
        if "volume_id" in handle:  # a stray volume found by the sweep: "running" while it exists
            vols = self._call(
                "DescribeVolumes",
                lambda: ec2.describe_volumes(
                    Filters=[{"Name": "volume-id", "Values": [handle["volume_id"]]}]
                ),
            )["Volumes"]
            return AttemptStatus(Phase.STARTING if vols else Phase.LOST, detail="volume")
        try:
            found = self._call(
                "DescribeInstances", lambda: ec2.describe_instances(InstanceIds=[handle["id"]])
            )
        except ProviderError as exc:
            if "InvalidInstanceID" in exc.message:
                return AttemptStatus(Phase.LOST, detail=f"instance {handle['id']} is gone")
            raise
        instance = found["Reservations"][0]["Instances"][0]
        state = instance["State"]["Name"]
        launched = instance["LaunchTime"].timestamp()
        record = self._exit_record(handle)
        if record is not None:
            self._copy_log(handle)
            if state not in ("shutting-down", "terminated"):  # done: stop paying for it
                self.terminate(handle)
            code, ended = int(record["exit_code"]), float(record["ended_at"])
            started = float(record.get("started_at", launched))
            if record.get("stopping") and code > 128:  # killed by the shutdown's SIGTERM
                return AttemptStatus(
                    Phase.LOST, code, ended, started, detail="stopped before it could save"
                )
            return AttemptStatus(Phase.EXITED, exit_code=code, ended_at=ended, running_at=started)
        if state == "pending":
            return AttemptStatus(Phase.STARTING, detail=state)
        reason = instance.get("StateReason", {}) or {}
        stopped_at = _transition_time(instance.get("StateTransitionReason", ""))
        if state == "running" or (  # shutting down: the exit record may still come
            state in ("shutting-down", "terminated")
            and stopped_at is not None
            and reason.get("Code") == "Client.UserInitiatedShutdown"
            and time.time() < stopped_at + self.features.grace_s + 2 * self.opts.poll_s
        ):
            return AttemptStatus(Phase.RUNNING, running_at=launched, detail=state)
        what = {
            "Server.SpotInstanceTermination": "spot interruption",
            "Client.UserInitiatedShutdown": "terminated by a user or the controller",
            "Client.InstanceInitiatedShutdown": "shut down from inside, without an exit record",
        }.get(reason.get("Code", ""), reason.get("Message", state))
        return AttemptStatus(
            Phase.LOST, running_at=launched, detail=f"{handle['id']} {state}: {what}"
        )

    def terminate(self, handle: Handle) -> None:
        """TerminateInstances (EC2 shuts it down: SIGTERM, then the grace, then off);
        idempotent. A stray volume handle is deleted, as are the job's placement and security
        groups once the sweep finds them unused."""
        if "nodes" in handle:
            cloud_nodes.terminate_nodes(handle, self.terminate)
            return
        ec2 = self._client(handle)
        if "cluster" in handle:
            patience = self.features.grace_s + 60.0  # (an instance's shutdown, then its ENI)
            aws_cluster.delete(
                self._call, ec2, handle["cluster"], handle["id"], self._sleep, patience
            )
            return
        try:
            if "volume_id" in handle:
                self._call("DeleteVolume", lambda: ec2.delete_volume(VolumeId=handle["volume_id"]))
            elif self._state(handle) not in ("shutting-down", "terminated"):
                # (asking again would restart the record of when the shutdown began)
                self._call(
                    "TerminateInstances",
                    lambda: ec2.terminate_instances(InstanceIds=[handle["id"]]),
                )
        except ProviderError as exc:
            if "NotFound" not in exc.message:
                raise

    def _state(self, handle: Handle) -> str:
        found = self._call(
            "DescribeInstances",
            lambda: self._client(handle).describe_instances(InstanceIds=[handle["id"]]),
        )
        return str(found["Reservations"][0]["Instances"][0]["State"]["Name"])

    def find(self, job_id: str, attempts_dir: Path) -> list[Handle]:
        """The job's instances not yet terminated, and its volumes left unattached, in every
        region of the job."""
        found: list[Handle] = []
        for region in self.regions:
            found += self._find_in(region, job_id, attempts_dir)
        return found

    def _find_in(self, region: str, job_id: str, attempts_dir: Path) -> list[Handle]:
        ec2 = self._ec2[region]
        job = [{"Name": f"tag:{JOB_TAG}", "Values": [job_id]}]
        found: list[Handle] = []
        pages = self._call(
            "DescribeInstances",
            lambda: (
                ec2.get_paginator("describe_instances").paginate(Filters=job).build_full_result()
            ),
        )
        # (terminated ones too, which EC2 lists for about an hour: they tell a multi-node job)
        every = [i for r in pages["Reservations"] for i in r["Instances"]]
        nodes: list[cloud_nodes.FoundNode] = []  # of multi-node launches
        for inst in every:
            state = inst["State"]["Name"]
            if state not in LIVE_STATES:
                continue
            tags = {t["Key"]: t["Value"] for t in inst.get("Tags", [])}
            handle = {
                "n": int(tags.get(ATTEMPT_TAG, "0")),
                "id": inst["InstanceId"],
                "job": job_id,
                "zone": inst["Placement"]["AvailabilityZone"],
                "region": region,
                "log": str(attempts_dir.with_name("job.log")),  # as launch's handle
            }
            if NODES_TAG not in tags:
                found.append(handle)
                continue
            nodes.append(
                cloud_nodes.FoundNode(
                    handle,
                    inst["InstanceId"],
                    rank=int(tags[RANK_TAG]),
                    nodes=int(tags[NODES_TAG]),
                    launch=tags.get(LAUNCH_TAG, ""),
                    ending=state == "shutting-down",
                )
            )
        found += cloud_nodes.launches(nodes)
        multi_node = any(NODES_TAG in {t["Key"] for t in i.get("Tags", [])} for i in every)
        if multi_node and all(  # its groups are being let go (a one-node job has none to ask)
            i["State"]["Name"] in ("shutting-down", "terminated") for i in every
        ):
            for kind, ident in aws_cluster.find(self._call, ec2, JOB_TAG, job_id):
                found.append(
                    {"n": 0, "id": ident, "job": job_id, "region": region, "cluster": kind}
                )
        return found + self._left_volumes(region, job_id)

    def _left_volumes(self, region: str, job_id: str) -> list[Handle]:
        """The job's volumes no machine holds (a root volume that outlived its instance)."""
        ec2 = self._ec2[region]
        filters = [
            {"Name": f"tag:{JOB_TAG}", "Values": [job_id]},
            {"Name": "status", "Values": ["available"]},
        ]
        volumes = self._call("DescribeVolumes", lambda: ec2.describe_volumes(Filters=filters))[
            "Volumes"
        ]
        found: list[Handle] = []
        for vol in volumes:
            tags = {t["Key"]: t["Value"] for t in vol.get("Tags", [])}
            found.append(
                {
                    "n": int(tags.get(ATTEMPT_TAG, "0")),
                    "id": vol["VolumeId"],
                    "job": job_id,
                    "volume_id": vol["VolumeId"],
                    "region": region,
                }
            )
        return found

    # --- pieces ----------------------------------------------------------------------------
    def _run_args(
        self,
        token: str,
        market: str,
        zone: str,
        user_data: str,
        tags: dict[str, str],
        cluster: tuple[str, list[str]] | None = None,
    ) -> dict[str, Any]:
        o, region = self.opts, region_of(zone)
        args: dict[str, Any] = {
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": token,
            "InstanceType": self.instance_type,
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {
                "HttpTokens": "required",
                "HttpEndpoint": "enabled",
                "HttpPutResponseHopLimit": 2,
            },
        }
        if user_data:
            args["UserData"] = user_data
        if tags:
            spec = [{"Key": k, "Value": v} for k, v in tags.items()]
            args["TagSpecifications"] = [
                {"ResourceType": "instance", "Tags": spec},
                {"ResourceType": "volume", "Tags": spec},
            ]
        image = self._images.get(region)
        if image:
            args["ImageId"] = image
        else:
            assert o.launch_template is not None
            args["LaunchTemplate"] = _launch_template(o.launch_template)
        device = o.root_device or (self._root_device(region, image) if image else None)
        if device:
            args["BlockDeviceMappings"] = [{"DeviceName": device, "Ebs": _root_volume(o)}]
        if zone in o.subnets:
            args["SubnetId"] = o.subnets[zone]
        else:
            args["Placement"] = {"AvailabilityZone": zone}
        if self._groups.get(region):
            args["SecurityGroupIds"] = self._groups[region]
        if cluster is not None:
            args["Placement"] = {**args.get("Placement", {}), "GroupName": cluster[0]}
            args["SecurityGroupIds"] = cluster[1]
        if o.instance_profile:
            key = "Arn" if o.instance_profile.startswith("arn:") else "Name"
            args["IamInstanceProfile"] = {key: o.instance_profile}
        if o.key_name:
            args["KeyName"] = o.key_name
        if market == "spot":
            args["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": _spot(o)}
        return args

    def _root_device(self, region: str, image: str) -> str:
        images = self._call(
            "DescribeImages", lambda: self._ec2[region].describe_images(ImageIds=[image])
        )["Images"]
        if not images:
            raise ConfigError(
                f"provider.aws.image_id: no AMI {image!r} in {region}",
                hint="AMI ids differ per region: give image_id as a mapping of region to AMI "
                f"for {', '.join(self.regions)}",
            )
        return str(images[0].get("RootDeviceName") or "/dev/xvda")

    def _per_region(self, option: str, value: Any) -> dict[str, Any]:
        """An option given once (the same in every region) or as ``{region: value}``, per
        region of the job; a mapping must name exactly the job's regions."""
        if not isinstance(value, dict):
            return {r: value for r in self.regions}
        missing = [r for r in self.regions if r not in value]
        extra = sorted(set(value) - set(self.regions))
        problems = [f"no entry for {missing}"] * bool(missing)
        problems += [f"{extra} are not regions of the job"] * bool(extra)
        if problems:
            raise ConfigError(
                f"provider.aws.{option}: {'; '.join(problems)}",
                hint=f"give one entry per region of the job: {', '.join(self.regions)}",
            )
        return dict(value)

    def job_uri(self, job_id: str) -> str:
        return f"s3://{self.bucket}/{self.prefix + '/' if self.prefix else ''}{job_id}"

    def user_data(
        self, req: LaunchRequest, node: int = 0, endpoint: str = "", launch: str = ""
    ) -> str:
        """The cloud-init script of one attempt, or of its node ``node`` of the multi-node
        launch ``launch`` whose rendezvous is at ``endpoint`` (bash; no credentials in it)."""
        from spotwise.control.secret_refs import aws_fetch_script

        # env_from's SSM parameters and Secrets Manager secrets, fetched on the instance
        region = region_of(req.placement.zone or self.features.zones[0])
        node_req = cloud_nodes.node_request(req, self.opts.python, node, endpoint)
        report_uri = self._report_uri(req.job_id, req.n, (launch, node) if req.nodes > 1 else None)
        return boot_script(
            node_req,
            python=self.opts.python,
            workdir=self.opts.workdir,
            setup=self.opts.setup,
            report_uri=report_uri,
            shutdown_if='[ -d /var/lib/cloud/instance ] && [ "${SPOTWISE_EC2_EMULATED:-0}" != 1 ]',
            secrets=aws_fetch_script(req.env_from, self.opts.python, region),
        )

    def _exit_record(self, handle: Handle) -> dict[str, Any] | None:
        return exit_record(self._attempt_store(handle))

    def _attempt_store(self, handle: Handle) -> Any:
        from spotwise.storage.s3 import S3Storage

        return S3Storage.from_uri(
            self._report_uri(handle["job"], handle["n"], cloud_nodes.node_of(handle)),
            client=self.s3,
        )

    def _report_uri(self, job_id: str, n: int, node: tuple[str, int] | None = None) -> str:
        """Where an attempt's instance (or the node ``(launch, rank)``) reports its exit."""
        return cloud_nodes.node_uri(f"{self.job_uri(job_id)}/attempts/{n}", node)

    def _copy_log(self, handle: Handle) -> None:
        """Append the attempt's output (uploaded by the instance) to the job log, once."""
        if handle.get("log"):
            node = handle.get("node")
            where = f"aws {handle['id']}" + ("" if node is None else f" (node {node})")
            copy_log(self._attempt_store(handle), Path(handle["log"]), handle["n"], where, node)


def _launch_template(template: dict[str, str]) -> dict[str, str]:
    """``launch_template: {id|name, version}`` as RunInstances names its fields."""
    names = {"id": "LaunchTemplateId", "name": "LaunchTemplateName"}
    return {names.get(k, "Version"): v for k, v in template.items()}


def _root_volume(o: AwsOptions) -> dict[str, Any]:
    """The root EBS volume: gp3 of ``root_volume_gb``, deleted with the machine, encrypted as
    configured."""
    ebs: dict[str, Any] = {
        "VolumeSize": o.root_volume_gb,
        "VolumeType": "gp3",
        "DeleteOnTermination": True,
        "Encrypted": o.encrypted,
    }
    if o.kms_key_id:
        ebs["KmsKeyId"] = o.kms_key_id
    return ebs


def _spot(o: AwsOptions) -> dict[str, Any]:
    """A one-time spot request, terminated when taken back, capped at ``spot_max_usd_per_hour``."""
    spot: dict[str, Any] = {
        "SpotInstanceType": "one-time",
        "InstanceInterruptionBehavior": "terminate",
    }
    if o.spot_max_usd_per_hour is not None:
        spot["MaxPrice"] = f"{o.spot_max_usd_per_hour:.4f}"
    return spot
