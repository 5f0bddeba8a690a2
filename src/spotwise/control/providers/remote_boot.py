"""What a cloud VM runs at boot for one attempt, and how its exit comes back through S3.

A cloud VM's process is out of the controller's sight: the boot script runs the job's command,
then ``python -m spotwise.control.providers.aws report`` writes the exit record (and the output)
under the job's ``s3://`` prefix, where the controller reads it. The script carries no
credentials: the machine's identity supplies them.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from spotwise.control.providers.base import LaunchRequest
from spotwise.errors import StorageNotFoundError


def boot_script(
    req: LaunchRequest,
    *,
    python: str,
    workdir: str,
    setup: list[str],
    report_uri: str,
    shutdown_if: str,
    secrets: str = "",
) -> str:
    """A bash script: exports, run the command, report its exit to ``report_uri``, then
    power off when the shell test ``shutdown_if`` holds (a real VM, not a double)."""
    from spotwise.control.providers.aws import _bash_word

    env = req.env
    words = [
        shlex.quote(python) if a in ("python", "python3") and i == 0 else _bash_word(a, env)
        for i, a in enumerate(req.argv)
    ]
    exports = "\n".join(f"export {k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    lines = "\n".join(setup)
    return f"""#!/bin/bash
# spotwise job {req.job_id} attempt {req.n}: run the command, report its exit, shut down.
set -u
{exports}
LOG=$(mktemp -t spotwise-attempt.XXXXXX)
STARTED=$(date +%s.%N)
(
cd {shlex.quote(workdir)} || exit 1
{lines}
{secrets}
exec {" ".join(words)}
) >"$LOG" 2>&1 &
PID=$!
STOPPING=0  # the platform signals every process; this shell must live on to report
trap 'STOPPING=1' TERM
CODE=0
wait "$PID" || CODE=$?
while kill -0 "$PID" 2>/dev/null; do wait "$PID"; CODE=$?; done
{shlex.quote(python)} -m spotwise.control.providers.aws report {shlex.quote(report_uri)} \\
  --exit-code "$CODE" --started "$STARTED" --stopping "$STOPPING" --log "$LOG"
if {shutdown_if}; then
  shutdown -h now
fi
"""


class AttemptRecords:
    """The exit records and outputs the machines of one job prefix write to S3."""

    def __init__(self, s3: Any, job_uri: str, cloud: str) -> None:
        self.s3, self.job_uri, self.cloud = s3, job_uri.rstrip("/"), cloud

    def _get(self, handle: dict[str, Any], name: str) -> bytes:
        from spotwise.storage.s3 import S3Storage

        uri = f"{self.job_uri}/{handle['job']}/attempts/{handle['n']}"
        return S3Storage.from_uri(uri, client=self.s3).get_bytes(name)

    def exit_record(self, handle: dict[str, Any]) -> dict[str, Any] | None:
        """The attempt's ``exit.json``, or None while there is none (or it is not ours)."""
        try:
            body = self._get(handle, "exit.json")
        except StorageNotFoundError:
            return None
        try:
            record: dict[str, Any] = json.loads(body)
            int(record["exit_code"]), float(record["ended_at"])
        except (ValueError, KeyError, TypeError):
            return None  # S3 writes are whole, so this is not ours
        return record

    def copy_log(self, handle: dict[str, Any]) -> None:
        """Append the attempt's output (uploaded by the machine) to the job log, once."""
        if not handle.get("log"):
            return
        log = Path(handle["log"])
        marker = log.with_name(f".{self.cloud}-log-{handle['n']}")
        if marker.exists():
            return
        try:
            text = self._get(handle, "output.log")
        except StorageNotFoundError:
            text = b""
        with open(log, "ab") as f:
            head = f"[spotwise] attempt {handle['n']} on {self.cloud} {handle['id']}\n"
            f.write(head.encode() + text)
        marker.touch()
