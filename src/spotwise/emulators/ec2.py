"""An EC2 data plane beside a moto server: moto keeps the API's books, this runs the machines.

moto answers ``RunInstances`` but runs nothing. This emulator watches the moto endpoint (with
the real boto3) for instances tagged ``spotwise:job``, and plays each one's machine: it fetches
the instance's user-data and runs it as a local process in its own process group and its own
root directory (``machine_root``: the image, a fresh disk lost with the instance, none of the
controller's files), pointed at its own IMDS emulator (IMDSv2 required, as the provider asks).
It then behaves as EC2 does:

- the script exits: the instance shuts itself down (``InstanceInitiatedShutdownBehavior``
  terminate), so it is marked terminated;
- ``TerminateInstances`` (moto marks it terminated at once): the machine gets SIGTERM, then
  ``stop_grace_s`` later SIGKILL;
- a scheduled spot interruption: ``spot/instance-action`` appears on the instance's IMDS,
  ``notice_lead_s`` later the machine is killed and the instance is marked terminated with the
  spot ``StateReason`` (``Server.SpotInstanceTermination``), through moto's own backend API.

The last step needs moto in this process (``ThreadedMotoServer``, as the tests and
``spotwise emulate ec2`` run it), as do the placement groups and the loopback network
(every private address 127.0.0.1) that ``ec2_cluster`` adds to moto for multi-node attempts.
The processes get what an instance with an instance profile would have: credentials and the
S3 endpoint in their environment, never in the user-data. It shares no code with the aws
provider it exercises.
"""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotwise.emulators import ec2_cluster, machine_root
from spotwise.emulators.aws import AwsImdsEmulator

JOB_TAG = "spotwise:job"
SPOT_REASON = (
    "Server.SpotInstanceTermination: Spot instance termination",
    "Server.SpotInstanceTermination",
)
SHUTDOWN_REASON = (
    "Client.InstanceInitiatedShutdown: Instance initiated shutdown",
    "Client.InstanceInitiatedShutdown",
)


@dataclass
class Machine:
    """One emulated instance: its process, IMDS and schedule (wall times)."""

    instance_id: str
    index: int  # launch order, 0-based: which entry of the interruption schedule applies
    proc: subprocess.Popen[bytes]
    imds: AwsImdsEmulator
    notice_at: float | None = None
    kill_at: float | None = None
    interrupted: bool = False
    stopped_by_api: bool = False
    ended: str = ""  # "exited" | "interrupted" | "terminated"
    exit_code: int | None = None


@dataclass
class Ec2DataPlane:
    """``Ec2DataPlane(endpoint, workdir=...).start()`` ... ``.stop()``.

    ``interrupt_after_s[i]``: seconds after the i-th instance starts that its spot notice
    appears (None or missing: never). ``instance_endpoint``: the AWS endpoint the instances'
    processes use (default ``endpoint``; a test puts a fault proxy in front of the controller
    only). ``python_bin``: a directory put first on the machines' PATH (default: this
    interpreter's), standing for an AMI with the job's environment installed. ``image``: the
    job's code on that AMI (default: this process's working directory), beside this Python
    and spotwise; nothing else of this host is on the machines' disk.
    """

    endpoint: str
    workdir: Path
    region: str = "us-east-1"
    interrupt_after_s: Sequence[float | None] = ()
    notice_lead_s: float = 2.0
    stop_grace_s: float = 10.0
    poll_s: float = 0.2
    instance_endpoint: str | None = None
    python_bin: str | None = None
    image: Sequence[Path] | None = None
    machines: dict[str, Machine] = field(default_factory=dict)

    def __post_init__(self) -> None:
        import boto3

        self._ec2 = boto3.client(
            "ec2",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._foreign: set[str] = set()
        self.errors: list[str] = []
        self._image = machine_root.machine_image(self.image)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> Ec2DataPlane:
        self.workdir.mkdir(parents=True, exist_ok=True)
        ec2_cluster.install()  # placement groups and the loopback network, in this moto
        # instances from before this plane started were never its machines: leave them be
        self._foreign = set(self._states())
        self._thread = threading.Thread(target=self._loop, name="ec2-data-plane", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        with self._lock:
            for m in self.machines.values():
                if m.proc.poll() is None:
                    _killpg(m.proc.pid, signal.SIGKILL)
                    m.proc.wait()
                m.imds.stop()

    def __enter__(self) -> Ec2DataPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def interrupt(self, instance_id: str, now: float | None = None) -> None:
        """Reclaim a running instance now: its spot notice, then the kill ``notice_lead_s``
        later (what ``interrupt_after_s`` schedules, for a test that waits for an event)."""
        with self._lock:
            m = self.machines[instance_id]
            m.notice_at = time.time() if now is None else now
            m.kill_at = m.notice_at + self.notice_lead_s

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick(time.time())
            except Exception as exc:  # keep the machines supervised through a moto hiccup
                self.errors.append(f"{type(exc).__name__}: {exc}")
            self._stop.wait(self.poll_s)

    # --- one pass --------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        states = self._states()
        with self._lock:
            for instance_id, state in states.items():
                if (
                    state == "running"
                    and instance_id not in self.machines
                    and instance_id not in self._foreign
                ):
                    self.machines[instance_id] = self._boot(instance_id, now)
            for m in self.machines.values():
                if not m.ended:
                    self._supervise(m, states.get(m.instance_id, "terminated"), now)

    def _states(self) -> dict[str, str]:
        out = self._ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": [JOB_TAG]}])
        return {
            i["InstanceId"]: i["State"]["Name"] for r in out["Reservations"] for i in r["Instances"]
        }

    def _boot(self, instance_id: str, now: float) -> Machine:
        attr = self._ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        script = base64.b64decode(attr.get("UserData", {}).get("Value", "") or b"")
        home = self.workdir / instance_id
        home.mkdir(parents=True, exist_ok=True)
        (home / "user-data").write_bytes(script)
        imds = AwsImdsEmulator(
            port=0, lead_s=self.notice_lead_s, imdsv2_required=True, instance_id=instance_id
        )
        env = self._machine_env(imds.start())
        with open(home / "console.log", "ab") as console:  # (as cloud-init runs user-data)
            proc = machine_root.start(
                ["/bin/bash", "-c", script.decode(errors="replace"), "user-data"],
                machine_dir=home / "machine",
                image=self._image,
                env=env,
                hide=[self.workdir],
                stdout=console,
            )
        index = len(self.machines)
        m = Machine(instance_id, index, proc, imds)
        after = self.interrupt_after_s[index] if index < len(self.interrupt_after_s) else None
        if after is not None:
            m.notice_at = now + after
            m.kill_at = m.notice_at + self.notice_lead_s
        return m

    def _machine_env(self, imds_url: str) -> dict[str, str]:
        """What the instance's processes see: the AMI's PATH, the instance profile's
        credentials, the VPC's S3 endpoint and the metadata service."""
        bin_dir = self.python_bin or os.path.dirname(sys.executable)
        env = {
            "PATH": f"{bin_dir}:/usr/local/bin:/usr/bin:/bin",
            "LANG": "C.UTF-8",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": self.region,
            "AWS_ENDPOINT_URL": self.instance_endpoint or self.endpoint,
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds_url,
            "SPOTWISE_PLATFORM": "aws",
            "SPOTWISE_EC2_EMULATED": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        }
        if os.environ.get("PYTHONPATH"):  # where this spotwise lives, as installed on the AMI
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        return env

    def _supervise(self, m: Machine, state: str, now: float) -> None:
        code = m.proc.poll()
        if code is not None:  # the user-data finished: the machine powers itself off
            m.exit_code = code
            m.imds.stop()
            machine_root.discard(self.workdir / m.instance_id / "machine")
            if not m.stopped_by_api:
                self._mark_terminated(m.instance_id, SHUTDOWN_REASON)
            m.ended = "terminated" if m.stopped_by_api else "exited"  # last: the books agree
            return
        if (
            state in ("shutting-down", "terminated", "stopping", "stopped")
            and not m.stopped_by_api
            and not m.interrupted
        ):
            m.stopped_by_api = True  # TerminateInstances: ACPI shutdown, then power off
            _killpg(m.proc.pid, signal.SIGTERM)
            m.kill_at = min(m.kill_at or float("inf"), now + self.stop_grace_s)
        if (
            m.notice_at is not None
            and now >= m.notice_at
            and not m.interrupted
            and not m.stopped_by_api
        ):
            m.interrupted = True
            m.imds.trigger_notice()
        if m.kill_at is not None and now >= m.kill_at:
            _killpg(m.proc.pid, signal.SIGKILL)
            m.exit_code = m.proc.wait()
            m.imds.stop()
            machine_root.discard(self.workdir / m.instance_id / "machine")
            if m.interrupted and not m.stopped_by_api:
                self._mark_terminated(m.instance_id, SPOT_REASON)
                m.ended = "interrupted"
            else:
                m.ended = "terminated"

    def _mark_terminated(self, instance_id: str, reason: tuple[str, str]) -> None:
        """Terminate the instance in moto's books with EC2's own StateReason."""
        from moto.core import DEFAULT_ACCOUNT_ID
        from moto.ec2.models import ec2_backends
        from moto.ec2.models.instances import StateReason

        backend: Any = ec2_backends[DEFAULT_ACCOUNT_ID][self.region]
        try:
            instance = backend.get_instance(instance_id)
        except Exception as exc:
            raise RuntimeError(
                f"instance {instance_id} is not in this process's moto: run the "
                "EC2 emulator in the moto server's process"
            ) from exc
        if instance.state != "terminated":
            backend.terminate_instances([instance_id])
        instance.state_reason = StateReason(*reason)
        instance._reason = reason[0]


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return
