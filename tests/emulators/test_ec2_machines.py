"""The EC2 double's instances, each in a root directory of its own: the controller's files are
not on an instance's disk, and what one instance writes to its disk is gone with it (only S3
outlives it), as on EC2. Driven by the real boto3 against moto on loopback."""

from __future__ import annotations

import os
import time
from pathlib import Path

import boto3
import pytest

from spotwise.emulators import machine_root
from spotwise.emulators.ec2 import Ec2DataPlane

# what each instance's user-data tries: the controller's file, the last instance's leftovers
PROBE = """#!/bin/bash
cat {canary} 2>/dev/null && echo canary-read || echo canary-unreachable
for f in left-in-cwd "$HOME/left-in-home" /tmp/left-in-tmp; do [ -e "$f" ] && echo "saw $f"; done
echo "cwd $(pwd) home $HOME"
touch left-in-cwd "$HOME/left-in-home" /tmp/left-in-tmp
python3 -c "import spotwise, boto3" && echo image-ok
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="a mount namespace needs root (as here and in CI)")
def test_each_instance_has_its_own_disk_without_the_controllers_files(aws_env, tmp_path: Path):
    controller_home = tmp_path / "spotwise-home"
    controller_home.mkdir()
    (controller_home / "spotwise.db").write_text("the controller's secrets")
    ec2 = boto3.client("ec2", endpoint_url=aws_env)
    script = PROBE.format(canary=controller_home / "spotwise.db")
    tags = [{"ResourceType": "instance", "Tags": [{"Key": "spotwise:job", "Value": "probe"}]}]
    with Ec2DataPlane(aws_env, workdir=tmp_path / "ec2", poll_s=0.05) as plane:
        assert machine_root.isolated()
        logs = []
        for _ in range(2):  # one after the other: the second is the next attempt's machine
            [inst] = ec2.run_instances(
                ImageId="ami-03cf127a",
                MinCount=1,
                MaxCount=1,
                UserData=script,
                TagSpecifications=tags,
            )["Instances"]
            deadline = time.monotonic() + 60
            while (
                inst["InstanceId"] not in plane.machines
                or not plane.machines[inst["InstanceId"]].ended
            ):
                assert time.monotonic() < deadline, plane.errors
                time.sleep(0.05)
            logs.append((tmp_path / "ec2" / inst["InstanceId"] / "console.log").read_text())
    for log in logs:
        assert "canary-unreachable" in log and "canary-read" not in log, log
        assert "saw " not in log and "image-ok" in log, log
        assert "cwd /root home /root" in log
    assert not (tmp_path / "ec2" / "left-in-cwd").exists()
