"""What a multi-node attempt on EC2 needs besides its instances, kept per job and found by tag.

- A **cluster placement group** ``spotwise-<job>-<zone>``: the nodes on one low-latency segment
  of a zone, which is what an all-reduce over several machines needs. A cluster group lives in
  one zone (its first instance fixes which), so a job that moves zone gets one per zone; later
  attempts in that zone reuse it.
- A **security group** ``spotwise-<job>`` in the zone's VPC with one rule: TCP on every port
  from the group itself. The rendezvous port alone would not do: gloo and NCCL open ports of
  their own between the ranks once the rendezvous is done. The nodes keep their other groups
  (the job's ``security_group_ids``, else the VPC's default group).

Both are tagged ``spotwise:job`` and cost nothing. The provider's ``find`` reports them once no
instance of the job is alive in their region (shutting down counts as gone), so the
controller's orphan sweep at the end of the job (or at its next start) deletes them, as it
does stray volumes, waiting for the last instances to let go of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from spotwise.errors import ConfigError, ProviderError

Call = Callable[[str, Callable[[], Any]], Any]  # the provider's ``_call(what, fn)``
KINDS = ("placement_group", "security_group")
# an instance that is shutting down still holds its groups: left for the next sweep
IN_USE = ("InvalidPlacementGroup.InUse", "DependencyViolation")
GONE = ("InvalidPlacementGroup.Unknown", "InvalidGroup.NotFound")


def _tagged(kind: str, tags: dict[str, str]) -> list[dict[str, Any]]:
    return [{"ResourceType": kind, "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}]


def _tolerate(exc: ProviderError, codes: tuple[str, ...]) -> None:
    if not any(code in exc.message for code in codes):
        raise exc


def placement_group(call: Call, ec2: Any, job_id: str, zone: str, tags: dict[str, str]) -> str:
    """The job's cluster placement group in ``zone`` (created on first use)."""
    name = f"spotwise-{job_id}-{zone}"
    try:
        call(
            "CreatePlacementGroup",
            lambda: ec2.create_placement_group(
                GroupName=name,
                Strategy="cluster",
                TagSpecifications=_tagged("placement-group", tags),
            ),
        )
    except ProviderError as exc:
        _tolerate(exc, ("InvalidPlacementGroup.Duplicate",))
    return name


def vpc_of(call: Call, ec2: Any, subnet: str | None, region: str) -> str:
    """The VPC the nodes run in: their subnet's, else the region's default VPC."""
    if subnet:
        found = call("DescribeSubnets", lambda: ec2.describe_subnets(SubnetIds=[subnet]))
        return str(found["Subnets"][0]["VpcId"])
    vpcs = call(
        "DescribeVpcs",
        lambda: ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}]),
    )["Vpcs"]
    if not vpcs:
        raise ConfigError(
            f"provider.aws.subnets: {region} has no default VPC for the job's nodes",
            hint="map each zone to a subnet (provider.aws.subnets)",
        )
    return str(vpcs[0]["VpcId"])


def _groups_named(call: Call, ec2: Any, vpc_id: str, name: str) -> list[dict[str, Any]]:
    filters = [{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "group-name", "Values": [name]}]
    out = call("DescribeSecurityGroups", lambda: ec2.describe_security_groups(Filters=filters))
    return list(out["SecurityGroups"])


def default_group(call: Call, ec2: Any, vpc_id: str) -> str:
    """The VPC's default security group: what an instance launched without groups gets."""
    return str(_groups_named(call, ec2, vpc_id, "default")[0]["GroupId"])


def security_group(call: Call, ec2: Any, job_id: str, vpc_id: str, tags: dict[str, str]) -> str:
    """The job's security group in ``vpc_id`` with its one rule (created on first use; the
    rule is added again, idempotently, should a crash have come between the two)."""
    name = f"spotwise-{job_id}"
    found = _groups_named(call, ec2, vpc_id, name)
    if found:
        group = str(found[0]["GroupId"])
    else:
        group = call(
            "CreateSecurityGroup",
            lambda: ec2.create_security_group(
                GroupName=name,
                Description=f"spotwise job {job_id}: its nodes reach each other",
                VpcId=vpc_id,
                TagSpecifications=_tagged("security-group", tags),
            ),
        )["GroupId"]
    rule = {
        "IpProtocol": "tcp",
        "FromPort": 0,
        "ToPort": 65535,
        "UserIdGroupPairs": [{"GroupId": group, "Description": "rendezvous and collectives"}],
    }
    try:
        call(
            "AuthorizeSecurityGroupIngress",
            lambda: ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=[rule]),
        )
    except ProviderError as exc:
        _tolerate(exc, ("InvalidPermission.Duplicate",))
    return group


def find(call: Call, ec2: Any, job_tag: str, job_id: str) -> list[tuple[str, str]]:
    """``(kind, name or id)`` of the job's placement and security groups in ``ec2``'s region."""
    by_job = [{"Name": f"tag:{job_tag}", "Values": [job_id]}]
    groups = call("DescribePlacementGroups", lambda: ec2.describe_placement_groups(Filters=by_job))[
        "PlacementGroups"
    ]
    secs = call("DescribeSecurityGroups", lambda: ec2.describe_security_groups(Filters=by_job))[
        "SecurityGroups"
    ]
    return [("placement_group", g["GroupName"]) for g in groups] + [
        ("security_group", g["GroupId"]) for g in secs
    ]


def exists(call: Call, ec2: Any, kind: str, ident: str) -> bool:
    try:
        if kind == "placement_group":
            out = call(
                "DescribePlacementGroups", lambda: ec2.describe_placement_groups(GroupNames=[ident])
            )["PlacementGroups"]
        else:
            out = call(
                "DescribeSecurityGroups", lambda: ec2.describe_security_groups(GroupIds=[ident])
            )["SecurityGroups"]
    except ProviderError as exc:
        _tolerate(exc, GONE)
        return False
    return bool(out)


def delete(
    call: Call, ec2: Any, kind: str, ident: str, sleep: Callable[[float], None], patience_s: float
) -> None:
    """Delete one of them; gone already is done. One still held by an instance that is
    shutting down is tried again for ``patience_s``, then left for the next sweep."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            if kind == "placement_group":
                call("DeletePlacementGroup", lambda: ec2.delete_placement_group(GroupName=ident))
            else:
                call("DeleteSecurityGroup", lambda: ec2.delete_security_group(GroupId=ident))
            return
        except ProviderError as exc:
            _tolerate(exc, GONE + IN_USE)
            if any(code in exc.message for code in GONE) or time.monotonic() >= deadline:
                return
        sleep(5.0)
