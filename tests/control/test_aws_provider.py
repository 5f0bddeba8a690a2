"""The aws provider against moto's EC2 + S3 on loopback with the real boto3; faults come from
the fault proxy on the wire. (Instances running, interruptions: tests/e2e/test_launch_aws.py.)"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest

from spotwise.cli.emulate import parse_ec2_fault
from spotwise.control.launching import launch_request
from spotwise.control.providers import LaunchRequest, Placement, make_provider
from spotwise.control.spec import parse_spec
from spotwise.control.submission import submit
from spotwise.emulators.fault_proxy import Fault, FaultProxy
from spotwise.errors import (
    CapacityError,
    ConfigError,
    ProviderUnavailableError,
    TransientProviderError,
)


@pytest.fixture(scope="module")
def ami(moto_server: str) -> str:
    """One of moto's AMIs (listing them all takes seconds, so once per module)."""
    ec2 = boto3.client(
        "ec2",
        endpoint_url=moto_server,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    return str(ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"])


@pytest.fixture()
def aws(aws_env: str, ami: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A bucket, an AMI and options pointing at them; AWS_MAX_ATTEMPTS keeps retries short."""
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "3")
    bucket = f"aws-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=aws_env).create_bucket(Bucket=bucket)
    ec2 = boto3.client("ec2", endpoint_url=aws_env)
    options = {
        "region": "us-east-1",
        "s3": f"s3://{bucket}/jobs",
        "image_id": ami,
        "zones": ["us-east-1a", "us-east-1b"],
        "instance_type": "g4dn.xlarge",
        "poll_s": 0.1,
    }
    return {"endpoint": aws_env, "ec2": ec2, "options": options, "bucket": bucket}


def _proxy(
    aws: dict[str, Any], monkeypatch: pytest.MonkeyPatch, *faults: str, **kw: Any
) -> FaultProxy:
    proxy = FaultProxy(aws["endpoint"], **kw)
    for f in faults:
        proxy.add(parse_ec2_fault(f))
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    return proxy


def _req(
    tmp_path: Path, market: str = "spot", zone: str = "us-east-1b", **env: str
) -> LaunchRequest:
    return LaunchRequest(
        job_id=f"j{uuid.uuid4().hex[:6]}",
        n=1,
        argv=("python", "train.py", "--steps", "3"),
        workdir=tmp_path,
        env={"SPOTWISE_ATTEMPT": "1", **env},
        log_path=tmp_path / "log",
        attempt_dir=tmp_path / "attempts" / "1",
        placement=Placement(market, zone),
    )


def test_a_spot_launch_asks_ec2_for_what_the_issue_lists(aws, tmp_path: Path):
    ec2 = aws["ec2"]
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24", AvailabilityZone="us-east-1b")[
        "Subnet"
    ]["SubnetId"]
    sg = ec2.create_security_group(
        GroupName=f"sw-{uuid.uuid4().hex[:6]}", Description="t", VpcId=vpc
    )["GroupId"]
    boto3.client("iam", endpoint_url=aws["endpoint"]).create_instance_profile(
        InstanceProfileName="sw-role"
    )
    options = {
        **aws["options"],
        "subnets": {"us-east-1b": subnet},
        "zones": ["us-east-1b"],
        "security_group_ids": [sg],
        "instance_profile": "sw-role",
        "spot_max_usd_per_hour": 0.4,
    }
    p = make_provider("aws", options, epoch=0.0, preflight=True)
    spec = parse_spec(
        {
            "command": "python train.py --run-dir $SPOTWISE_CHECKPOINT_DIR --steps 3 "
            "--tag '$$SPOTWISE_ATTEMPT-$HOME-${SPOTWISE_ATTEMPT}x'",
            "provider": {"name": "aws", **options},
        },
        base_dir=tmp_path,
    )
    job_dir = tmp_path / "home" / "jobs" / "j1"
    req = launch_request(
        spec, p, "j1", 1, Placement("spot", "us-east-1b"), job_dir=job_dir, log_path=tmp_path / "l"
    )
    handle = p.launch(req)
    [inst] = ec2.describe_instances(InstanceIds=[handle["id"]])["Reservations"][0]["Instances"]
    assert inst["InstanceLifecycle"] == "spot" and inst["SubnetId"] == subnet
    assert inst["InstanceType"] == "g4dn.xlarge"
    assert inst["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2 only
    assert [g["GroupId"] for g in inst["SecurityGroups"]] == [sg]
    assert inst["IamInstanceProfile"]["Arn"].endswith("/sw-role")
    tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
    assert tags["spotwise:job"] == req.job_id and tags["spotwise:attempt"] == "1"
    [vol] = ec2.describe_volumes(Filters=[{"Name": "tag:spotwise:job", "Values": [req.job_id]}])[
        "Volumes"
    ]
    assert vol["Encrypted"] and vol["Size"] == 100 and vol["VolumeType"] == "gp3"
    user_data = base64.b64decode(
        ec2.describe_instance_attribute(InstanceId=handle["id"], Attribute="userData")["UserData"][
            "Value"
        ]
    ).decode()
    uri = f"s3://{aws['bucket']}/jobs/{req.job_id}"
    assert f"SPOTWISE_CHECKPOINT_DIR={uri}/checkpoint" in user_data
    assert f"remote_boot report {uri}/attempts/1" in user_data
    # $SPOTWISE_CHECKPOINT_DIR is expanded by the instance's bash, to the S3 URI it exports;
    # the controller's job directory is nowhere (it is on a disk the instance cannot see)
    assert str(job_dir) not in user_data
    exports = [line for line in user_data.splitlines() if line.startswith("export ")]
    [command] = [line for line in user_data.splitlines() if line.startswith("exec ")]
    assert command.startswith('exec python3 train.py --run-dir "${SPOTWISE_CHECKPOINT_DIR}"')
    script = "\n".join([*exports, command.replace("exec python3", "printf '%s\\n'", 1)])
    printed = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={})
    assert printed.stdout.splitlines() == [
        "train.py", "--run-dir", f"{uri}/checkpoint", "--steps", "3",
        "--tag", "$SPOTWISE_ATTEMPT-$HOME-1x",  # as string.Template reads it: $$ and unknowns
    ]  # fmt: skip
    assert "testing" not in user_data and "AWS_" not in user_data  # no credentials in it
    # found by its tags after a crash, and terminated with its volume
    assert [(h["n"], h["id"]) for h in p.find(req.job_id, tmp_path)] == [(1, handle["id"])]
    p.terminate(handle)
    assert p.find(req.job_id, tmp_path) == []
    assert (
        ec2.describe_volumes(Filters=[{"Name": "tag:spotwise:job", "Values": [req.job_id]}])[
            "Volumes"
        ]
        == []
    )


def test_a_checkpoint_dir_the_instance_loses_is_refused_at_submit(aws, tmp_path):
    """A local path is on the instance's own disk, gone with it: every attempt would start
    again from step 0. Refused at submit, naming the key and the fix."""
    from spotwise.control.store import Store

    spec = parse_spec(
        {
            "command": "python train.py --run-dir $SPOTWISE_CHECKPOINT_DIR",
            "checkpoint_dir": "/data/ckpt",
            "provider": {"name": "aws", **aws["options"]},
        },
        base_dir=tmp_path,
    )
    store = Store()
    with pytest.raises(ConfigError) as info:
        submit(store, spec)
    assert "checkpoint_dir:" in info.value.message and "on the machine's own disk" in str(
        info.value
    )
    assert f"checkpoints to s3://{aws['bucket']}/jobs/<job id>/checkpoint" in str(info.value)
    assert store.jobs() == []


def test_credentials_in_the_job_env_are_refused_before_launch(aws, tmp_path: Path):
    p = make_provider("aws", aws["options"], epoch=0.0)
    with pytest.raises(ConfigError, match=r"AWS_SECRET_ACCESS_KEY.*user-data"):
        p.launch(_req(tmp_path, AWS_SECRET_ACCESS_KEY="x"))
    assert (
        aws["ec2"].describe_instances(Filters=[{"Name": "tag-key", "Values": ["spotwise:job"]}])
        is not None
    )


def test_capacity_errors_mean_try_elsewhere(aws, tmp_path: Path, monkeypatch):
    _proxy(
        aws,
        monkeypatch,
        "RunInstances=InsufficientInstanceCapacity:1",
        "RunInstances=SpotMaxPriceTooLow:1",
    )
    p = make_provider("aws", aws["options"], epoch=0.0)
    for code in ("InsufficientInstanceCapacity", "SpotMaxPriceTooLow"):
        with pytest.raises(CapacityError, match=code):
            p.launch(_req(tmp_path))
    assert p.launch(_req(tmp_path))["id"].startswith("i-")


def test_throttling_and_5xx_are_retried_then_reported_as_transient(aws, tmp_path, monkeypatch):
    proxy = _proxy(
        aws, monkeypatch, "RunInstances=RequestLimitExceeded:2", "DescribeInstances=503:2"
    )
    p = make_provider("aws", aws["options"], epoch=0.0)
    handle = p.launch(_req(tmp_path))  # third try succeeds
    assert p.status(handle).phase.value == "running"
    assert proxy.count("POST") >= 6
    proxy.add(parse_ec2_fault("DescribeInstances=500"))  # never recovers
    with pytest.raises(TransientProviderError, match="after 3 tries"):
        p.status(handle)


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"region": "us-east-9"}, ["provider.aws.region", "us-east-9"]),
        ({"zones": ["us-east-1z"]}, ["provider.aws.zones", "us-east-1z", "us-east-1a"]),
        (
            {"instance_type": "p9.huge", "spot_usd_per_hour": 1.0, "ondemand_usd_per_hour": 3.0},
            ["'p9.huge' is not offered", "resources.instance_type"],
        ),
        ({"s3": "s3://no-such-bucket-here/x"}, ["provider.aws.s3", "no-such-bucket-here"]),
    ],
)
def test_bad_settings_fail_at_submit_naming_the_setting(aws, change, words):
    with pytest.raises(ConfigError) as info:
        make_provider("aws", {**aws["options"], **change}, epoch=0.0, preflight=True)
    for word in words:
        assert word in str(info.value)


def test_a_subnet_in_another_zone_is_named(aws):
    ec2 = aws["ec2"]
    vpc = ec2.create_vpc(CidrBlock="10.8.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.8.1.0/24", AvailabilityZone="us-east-1b")[
        "Subnet"
    ]["SubnetId"]
    with pytest.raises(
        ConfigError,
        match=rf"provider.aws.subnets.us-east-1a: subnet {subnet} "
        "is in us-east-1b",
    ):
        make_provider(
            "aws",
            {**aws["options"], "zones": ["us-east-1a"], "subnets": {"us-east-1a": subnet}},
            epoch=0.0,
            preflight=True,
        )


def test_a_quota_error_fails_at_submit(aws, monkeypatch):
    _proxy(aws, monkeypatch, "RunInstances=VcpuLimitExceeded")
    with pytest.raises(ConfigError, match=r"quota.*VcpuLimitExceeded") as info:
        make_provider("aws", aws["options"], epoch=0.0, preflight=True)
    assert "Service Quotas" in str(info.value)


def test_missing_or_wrong_credentials_fail_at_submit(aws, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    with pytest.raises(ProviderUnavailableError, match="refused the credentials"):
        make_provider("aws", aws["options"], epoch=0.0, preflight=True)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAWRONG")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong")
    _proxy(aws, monkeypatch, require_access_key="testing")
    with pytest.raises(ProviderUnavailableError, match="AuthFailure"):
        make_provider("aws", aws["options"], epoch=0.0, preflight=True)


def test_the_job_file_checks_aws_options_in_its_own_words(tmp_path: Path):
    with pytest.raises(ConfigError) as info:
        parse_spec(
            {
                "command": "x",
                "provider": {
                    "name": "aws",
                    "region": "us-east-1",
                    "image_id": "ami-1",
                    "launch_template": {"name": "t"},
                    "instace_type": "g5",
                },
            },
            base_dir=tmp_path,
        )
    text = str(info.value)
    assert "provider.aws.s3: required option is missing\n" in text
    assert "provider.aws.instace_type: unknown option; did you mean 'instance_type'?" in text
    with pytest.raises(ConfigError, match="give exactly one of image_id and launch_template"):
        parse_spec(
            {
                "command": "x",
                "provider": {
                    "name": "aws",
                    "region": "us-east-1",
                    "s3": "s3://bucket/p",
                    "image_id": "ami-1",
                    "launch_template": {"name": "t"},
                },
            },
            base_dir=tmp_path,
        )


def test_a_stray_volume_of_the_job_is_found_and_deleted(aws, tmp_path: Path):
    ec2 = aws["ec2"]
    job = f"j{uuid.uuid4().hex[:6]}"
    vol = ec2.create_volume(
        AvailabilityZone="us-east-1a",
        Size=8,
        TagSpecifications=[
            {
                "ResourceType": "volume",
                "Tags": [
                    {"Key": "spotwise:job", "Value": job},
                    {"Key": "spotwise:attempt", "Value": "2"},
                ],
            }
        ],
    )
    p = make_provider("aws", aws["options"], epoch=0.0)
    [found] = p.find(job, tmp_path)
    assert (found["n"], found["id"]) == (2, vol["VolumeId"])
    assert p.status(found).phase.value == "starting"  # exists: the sweep will stop it
    p.terminate(found)
    assert p.find(job, tmp_path) == [] and p.status(found).phase.value == "lost"


def test_emulate_ec2_fault_flags_are_checked():
    with pytest.raises(ConfigError, match="OPERATION=CODE"):
        parse_ec2_fault("RunInstances")
    fault = parse_ec2_fault("DescribeInstances=RequestLimitExceeded:3")
    assert (fault.status, fault.code, fault.times) == (503, "RequestLimitExceeded", 3)


def test_a_spot_interruption_without_an_exit_record_is_a_lost_machine(aws, tmp_path: Path):
    from spotwise.emulators.ec2 import Ec2DataPlane

    p = make_provider("aws", aws["options"], epoch=0.0)
    req = LaunchRequest(
        job_id=f"j{uuid.uuid4().hex[:6]}",
        n=1,
        argv=("sleep", "60"),
        workdir=Path("/tmp"),  # (a folder every machine has: its own, empty)
        env={},
        log_path=tmp_path / "log",
        attempt_dir=tmp_path / "a",
        placement=Placement("spot", "us-east-1a"),
    )
    with Ec2DataPlane(
        aws["endpoint"],
        workdir=tmp_path / "ec2",
        interrupt_after_s=[0.5],
        notice_lead_s=0.5,
        poll_s=0.05,
    ):
        handle = p.launch(req)
        deadline = time.time() + 30
        while (status := p.status(handle)).phase.value in ("starting", "running"):
            assert time.time() < deadline
            time.sleep(0.1)
    assert status.phase.value == "lost" and "spot interruption" in status.detail


def test_describe_spot_price_history_feeds_the_price_store_and_the_estimates(aws):
    from spotwise.control.pricing import catalog_usd_per_hour
    from spotwise.market.prices import PriceStore
    from spotwise.market.sources import PriceRecord

    p = make_provider("aws", aws["options"], epoch=0.0, preflight=True)
    with PriceStore() as store:
        seen = store.history(instance_type="g4dn.xlarge", market="spot", region="us-east-1")
    assert {"us-east-1a", "us-east-1b"} <= {r.zone for r in seen}  # recorded at submit
    catalog = catalog_usd_per_hour("g4dn.xlarge", "us-east-1a", "spot")
    # moto's prices are dated 2006: too old to estimate with, so the catalog's stands
    assert p.prices.of(Placement("spot", "us-east-1a")).usd_per_hour == catalog
    fresh = PriceRecord(
        "aws",
        "us-east-1",
        "us-east-1a",
        "g4dn.xlarge",
        "spot",
        0.1234,
        int(time.time()) - 60,
        "test",
    )
    with PriceStore() as store:
        store.upsert([fresh])
    p = make_provider("aws", aws["options"], epoch=0.0)
    assert p.prices.of(Placement("spot", "us-east-1a")).usd_per_hour == 0.1234
    assert p.prices.of(Placement("spot", "us-east-1b")).usd_per_hour == catalog_usd_per_hour(
        "g4dn.xlarge", "us-east-1b", "spot"
    )


def test_an_unpinned_job_runs_where_the_advisor_placed_it(aws, tmp_path: Path):
    """No instance type, region or zones in the job file: submit advises from resources
    (1 x T4 with 8 CPUs), keeps the advised zones the account offers the type in, records why
    in the job's events and status, pins it in the stored job, and RunInstances uses it."""
    from spotwise.control.store import Store
    from spotwise.control.submission import provider_for, submit
    from spotwise.control.summary import job_summary
    from spotwise.market import load_catalog

    drop = ("instance_type", "zones", "region")
    options = {k: v for k, v in aws["options"].items() if k not in drop}
    spec = parse_spec(
        {
            "command": "python train.py",
            "resources": {"gpu": "T4", "gpu_count": 1, "cpus": 8},
            "provider": {"name": "aws", **options},
        },
        base_dir=tmp_path,
    )
    store = Store()
    job = submit(store, spec)
    chosen = job_summary(store, job)["placement"]
    itype, region, zones = chosen["instance_type"], chosen["region"], chosen["zones"]
    assert chosen["advised"] and chosen["market"] == "spot"
    [hw] = {(o.gpu, o.gpus, o.vcpus) for o in load_catalog().offers if o.instance_type == itype}
    assert hw[:2] == ("T4", 1) and hw[2] >= 8
    ec2 = boto3.client("ec2", endpoint_url=aws["endpoint"], region_name=region)
    offered = ec2.describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": [itype]}],
    )["InstanceTypeOfferings"]
    assert zones and set(zones) == {x["Location"] for x in offered}
    [event] = [e for e in store.events(job.id) if e["kind"] == "placement"]
    assert itype in event["message"] and zones[0] in event["message"]
    shown = subprocess.run(
        [sys.executable, "-c", "from spotwise.cli.main import main; main()", "status", job.id],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "200"},
    )
    [row] = [line for line in shown.stdout.splitlines() if " advised " in line]
    assert f"{itype} in {region} (zones {', '.join(zones)})" in row, shown.stdout
    p = provider_for(store.job(job.id))  # a later controller runs it in the same place
    assert (p.instance_type, p.region, p.features.zones) == (itype, region, tuple(zones))
    handle = p.launch(_req(tmp_path, zone=p.features.zones[0]))
    [inst] = ec2.describe_instances(InstanceIds=[handle["id"]])["Reservations"][0]["Instances"]
    assert inst["InstanceType"] == itype and inst["InstanceLifecycle"] == "spot"
    assert inst["Placement"]["AvailabilityZone"] == zones[0]
    p.terminate(handle)


@pytest.fixture()
def cluster(aws_env: str) -> dict[str, Any]:
    """A bucket, the example jobs' AMI (one of moto's: listing them all takes a minute on a
    busy machine) and the EC2 double's placement groups in this process's moto."""
    from spotwise.emulators import ec2_cluster

    ec2_cluster.install()
    bucket = f"aws-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=aws_env).create_bucket(Bucket=bucket)
    options = {
        "region": "us-east-1",
        "s3": f"s3://{bucket}/jobs",
        "image_id": "ami-03cf127a",
        "zones": ["us-east-1a", "us-east-1b"],
        "instance_type": "g4dn.xlarge",
        "poll_s": 0.1,
    }
    return {
        "endpoint": aws_env,
        "ec2": boto3.client("ec2", endpoint_url=aws_env),
        "options": options,
    }


def _nodes_req(tmp_path: Path, job_id: str) -> LaunchRequest:
    return LaunchRequest(
        job_id=job_id,
        n=1,
        argv=("python", "train.py"),
        workdir=Path("/tmp"),
        env={},
        log_path=tmp_path / "log",
        attempt_dir=tmp_path / "attempts" / "1",
        placement=Placement("spot", "us-east-1a"),
        nodes=2,
    )


def _user_data(ec2: Any, instance_id: str) -> str:
    attr = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
    return base64.b64decode(attr["UserData"]["Value"]).decode()


def test_two_nodes_are_one_attempt_found_again_by_tag_and_their_groups_swept(cluster, tmp_path):
    """Rank 0 first, its private address in rank 1's rendezvous; both in the job's placement
    group and security group (one self-referencing rule); a restarted controller finds the
    attempt as one handle; a lost node stops the other; the groups go at the sweep."""
    from spotwise.control.providers.base import adoptable

    ec2, job = cluster["ec2"], f"j{uuid.uuid4().hex[:6]}"
    options = {**cluster["options"], "grace_s": 0}
    handle = make_provider("aws", options, epoch=0.0).launch(_nodes_req(tmp_path, job))
    by_id = {
        i["InstanceId"]: i
        for r in ec2.describe_instances(InstanceIds=handle["nodes"])["Reservations"]
        for i in r["Instances"]
    }
    rank0, rank1 = (by_id[i] for i in handle["nodes"])
    for k, inst in enumerate((rank0, rank1)):
        tags = {t["Key"]: t["Value"] for t in inst["Tags"]}
        assert (tags["spotwise:rank"], tags["spotwise:nodes"]) == (str(k), "2")
        assert inst["Placement"]["GroupName"] == f"spotwise-{job}-us-east-1a"
        assert {g["GroupName"] for g in inst["SecurityGroups"]} == {"default", f"spotwise-{job}"}
    port = handle["port"]
    first, second = (_user_data(ec2, i["InstanceId"]) for i in (rank0, rank1))
    assert f"--rdzv-endpoint=localhost:{port}" in first and "is_host=true" in first
    assert f"--rdzv-endpoint={rank0['PrivateIpAddress']}:{port}" in second
    assert "is_host=false" in second and "--nnodes=2" in second
    assert f"/attempts/1/{handle['launch']}/node-1" in second  # this launch's records
    assert "spotwise.runtime.launch" in second
    [group] = ec2.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [f"spotwise-{job}"]}]
    )["SecurityGroups"]
    [rule] = group["IpPermissions"]
    assert (rule["IpProtocol"], rule["FromPort"], rule["ToPort"]) == ("tcp", 0, 65535)
    assert [p["GroupId"] for p in rule["UserIdGroupPairs"]] == [group["GroupId"]]

    again = make_provider("aws", options, epoch=0.0)  # a controller restarted after a crash
    found = again.find(job, tmp_path / "attempts")
    assert adoptable(found, 1) == {**found[0], "nodes": handle["nodes"], "id": handle["id"]}
    assert len(found) == 1  # one attempt, not two instances to sweep as orphans
    ec2.terminate_instances(InstanceIds=[rank1["InstanceId"]])  # rank 1's machine is gone
    deadline = time.time() + 10
    while (status := again.status(found[0])).phase.value != "lost":
        assert time.time() < deadline, status
        time.sleep(0.1)
    [state] = {
        i["State"]["Name"]
        for r in ec2.describe_instances(InstanceIds=[rank0["InstanceId"]])["Reservations"]
        for i in r["Instances"]
    }
    assert state in ("shutting-down", "terminated")  # the other node was stopped with it
    swept = again.find(job, tmp_path / "attempts")  # nothing runs: the job's groups are orphans
    assert sorted(h["cluster"] for h in swept) == ["placement_group", "security_group"]
    for h in swept:
        assert again.status(h).phase.value == "starting"
        again.terminate(h)
        assert again.status(h).phase.value == "lost"
    assert again.find(job, tmp_path / "attempts") == []


def test_two_nodes_start_together_or_not_at_all(cluster, tmp_path: Path, monkeypatch):
    job = f"j{uuid.uuid4().hex[:6]}"
    proxy = _proxy(cluster, monkeypatch)
    proxy.add(
        Fault(
            "status",
            method="POST",
            body_contains=f"{job}-1-node-1",  # rank 1's RunInstances (its Name tag)
            status=500,
            code="InsufficientInstanceCapacity",
        )
    )
    p = make_provider("aws", cluster["options"], epoch=0.0)
    with pytest.raises(CapacityError, match="InsufficientInstanceCapacity"):
        p.launch(_nodes_req(tmp_path, job))
    proxy.close()
    live = cluster["ec2"].describe_instances(
        Filters=[
            {"Name": "tag:spotwise:job", "Values": [job]},
            {"Name": "instance-state-name", "Values": ["pending", "running"]},
        ]
    )["Reservations"]
    assert live == []  # rank 0 was up and is terminated: no half attempt is paid for


def _report_uri(ec2: Any, instance_id: str) -> str:
    """The ``s3://`` prefix an instance's user-data reports its exit to."""
    [uri] = re.findall(r"remote_boot report '?(s3://[^' ]+)", _user_data(ec2, instance_id))
    return uri


def test_a_rolled_back_node_is_not_read_as_the_next_launch_of_its_attempt(
    cluster, tmp_path: Path, monkeypatch
):
    """All or nothing rolls back rank 0 in the first zone (its SIGTERM makes it report 143,
    'stopping'); the attempt's next launch elsewhere is a machine of its own: its status is
    not that record, and a restarted controller adopts it, not the rolled-back node."""
    from spotwise.control.providers.base import adoptable
    from spotwise.storage.s3 import S3Storage

    ec2, job = cluster["ec2"], f"j{uuid.uuid4().hex[:6]}"
    proxy = _proxy(cluster, monkeypatch)
    proxy.add(
        Fault(
            "status",
            method="POST",
            body_contains=f"{job}-1-node-1",
            status=500,
            code="InsufficientInstanceCapacity",
        )
    )
    p = make_provider("aws", cluster["options"], epoch=0.0)
    with pytest.raises(CapacityError):
        p.launch(_nodes_req(tmp_path, job))
    [rolled_back] = [
        i
        for r in ec2.describe_instances(Filters=[{"Name": "tag:spotwise:job", "Values": [job]}])[
            "Reservations"
        ]
        for i in r["Instances"]
    ]
    # what the rolled-back rank 0 reports as its shutdown's SIGTERM kills the command
    S3Storage.from_uri(_report_uri(ec2, rolled_back["InstanceId"])).put(
        "exit.json",
        json.dumps(
            {"exit_code": 143, "started_at": 1.0, "ended_at": time.time(), "stopping": True}
        ).encode(),
    )
    req = replace(_nodes_req(tmp_path, job), placement=Placement("spot", "us-east-1b"))
    handle = p.launch(req)  # the same attempt, the next zone
    assert _report_uri(ec2, handle["nodes"][0]) != _report_uri(ec2, rolled_back["InstanceId"])
    assert p.status(handle).phase.value == "running"
    found = make_provider("aws", cluster["options"], epoch=0.0).find(job, tmp_path)
    assert adoptable(found, 1)["id"] == handle["id"]
    p.terminate(handle)
    proxy.close()


def test_a_one_node_job_never_asks_for_placement_groups(aws, tmp_path: Path, monkeypatch):
    """The single-instance path needs only the least-privilege policy: finding a finished
    one-node job's machines asks nothing of placement or security groups."""
    p = make_provider("aws", aws["options"], epoch=0.0)
    req = _req(tmp_path)
    handle = p.launch(req)
    aws["ec2"].terminate_instances(InstanceIds=[handle["id"]])
    proxy = _proxy(aws, monkeypatch)
    denied = [
        Fault(
            "status",
            method="POST",
            body_contains=f"Action={action}",
            status=403,
            code="UnauthorizedOperation",
            times=10,
        )
        for action in ("DescribePlacementGroups", "DescribeSecurityGroups")
    ]
    for fault in denied:
        proxy.add(fault)
    assert make_provider("aws", aws["options"], epoch=0.0).find(req.job_id, tmp_path) == []
    assert [f.hits for f in denied] == [0, 0]
    proxy.close()
