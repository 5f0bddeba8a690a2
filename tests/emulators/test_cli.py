"""``spotwise emulate`` as a user runs it: prints the variable to export, serves, stops."""

from __future__ import annotations

import http.client
import os
import subprocess
import sys
import time
from pathlib import Path

SPOTWISE = str(Path(sys.executable).with_name("spotwise"))


def test_emulate_aws_serves_a_notice_and_stops() -> None:
    proc = subprocess.Popen(
        [SPOTWISE, "emulate", "aws", "--port", "0", "--notice-after", "0", "--duration", "20"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "listening on http://127.0.0.1:" in first
        export = proc.stdout.readline().strip()
        assert export.startswith("export AWS_EC2_METADATA_SERVICE_ENDPOINT=http://127.0.0.1:")
        port = int(export.rsplit(":", 1)[1])
        deadline = time.monotonic() + 10
        while True:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/latest/meta-data/spot/instance-action")
            status = conn.getresponse().status
            conn.close()
            if status == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert status == 200
    finally:
        proc.terminate()
        proc.wait(10)


def test_emulate_rejects_bad_options() -> None:
    done = subprocess.run(
        [SPOTWISE, "emulate", "azure", "--port", "0", "--event-type", "Explode"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "unknown event type 'Explode'" in done.stderr


def test_emulate_aws_placement_options() -> None:
    proc = subprocess.Popen(
        [SPOTWISE, "emulate", "aws", "--port", "0", "--instance-type", "p4d.24xlarge",
         "--region", "ap-northeast-1", "--zone", "ap-northeast-1c", "--duration", "20"],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        proc.stdout.readline()
        port = int(proc.stdout.readline().strip().rsplit(":", 1)[1])
        got = {}
        for leaf in ("instance-type", "placement/region", "placement/availability-zone"):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", f"/latest/meta-data/{leaf}")
            got[leaf] = conn.getresponse().read().decode()
            conn.close()
        assert got == {"instance-type": "p4d.24xlarge", "placement/region": "ap-northeast-1",
                       "placement/availability-zone": "ap-northeast-1c"}  # fmt: skip
    finally:
        proc.terminate()
        proc.wait(10)


def test_emulate_refuses_a_zone_outside_its_region() -> None:
    done = subprocess.run(
        [
            SPOTWISE,
            "emulate",
            "aws",
            "--port",
            "0",
            "--region",
            "eu-west-1",
            "--zone",
            "us-east-1a",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "zone 'us-east-1a' is not a zone of region 'eu-west-1'" in done.stderr
