"""What a cloud VM runs at boot for one attempt, and how its exit comes back through its store.

A cloud VM's process is out of the controller's sight: the boot script (EC2 user-data, a
Compute Engine startup script, Azure custom data) runs the job's command, then
``python -m spotwise.control.providers.remote_boot report`` writes the exit record
(``exit.json``) and the output (``output.log``) under the attempt's prefix of the job's object
store (``s3://``, ``gs://``, ``az://``: through the Storage seam), where the controller reads
them. The script carries no credentials: the machine's identity supplies them.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from spotwise.control.providers.base import LaunchRequest, remote_words
from spotwise.control.workdir import MACHINE_DIR, unpack_shell
from spotwise.errors import StorageNotFoundError


def enter_workdir(req: LaunchRequest, workdir: str | None, python: str) -> str:
    """The shell line that puts the command in its code: the packed workdir fetched and
    unpacked (the machine identity's rights), or the folder on the image."""
    if req.code is not None:
        return unpack_shell(req.code, workdir or MACHINE_DIR, python)
    return f"cd {shlex.quote(workdir or str(req.workdir))} || exit 1"


def boot_script(
    req: LaunchRequest,
    *,
    python: str,
    workdir: str | None,
    setup: list[str],
    report_uri: str,
    shutdown_if: str,
    secrets: str = "",
) -> str:
    """A bash script: exports, run the command, report its exit to ``report_uri``, then
    power off when the shell test ``shutdown_if`` holds (a real VM, not a double)."""
    env = req.env
    words = [
        shlex.quote(python) if a in ("python", "python3") and i == 0 else bash_word(a, env)
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
{enter_workdir(req, workdir, python)}
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
trap '' TERM  # the report ignores a stop that comes now (inherited; the platform's KILL ends it)
{shlex.quote(python)} -m spotwise.control.providers.remote_boot report {shlex.quote(report_uri)} \\
  --exit-code "$CODE" --started "$STARTED" --stopping "$STOPPING" --log "$LOG"
if {shutdown_if}; then
  shutdown -h now
fi
"""


def bash_word(word: str, env: dict[str, str]) -> str:
    """One command word for the instance's bash: its ``$NAME`` references to the exported
    variables expanded there (quoted: one word, as written), everything else literal."""
    return (
        "".join(
            f'"${{{text}}}"' if var else shlex.quote(text) for text, var in remote_words(word, env)
        )
        or "''"
    )


def exit_record(store: Any) -> dict[str, Any] | None:
    """The attempt's exit record from ``store`` (a ``Storage`` at the attempt's prefix),
    or None while there is none (object stores write whole objects: a malformed one is not
    ours, so no exit is known)."""
    try:
        record: dict[str, Any] = json.loads(store.get("exit.json"))
        int(record["exit_code"]), float(record["ended_at"])
    except StorageNotFoundError:
        return None
    except (ValueError, KeyError, TypeError):
        return None
    return record


def copy_log(store: Any, log: Path, n: int, where: str, node: int | None = None) -> None:
    """Append the attempt's uploaded output to the job log, once (``where``: the machine, as
    the log's header names it; ``node``: which machine of a multi-node attempt)."""
    marker = log.with_name(f".remote-log-{n}" + ("" if node is None else f"-node-{node}"))
    if marker.exists():
        return
    try:
        text = store.get("output.log")
    except StorageNotFoundError:
        text = b""
    with open(log, "ab") as f:
        f.write(f"[spotwise] attempt {n} on {where}\n".encode() + text)
    marker.touch()


def report(argv: list[str] | None = None) -> int:
    """On the machine: write the attempt's exit record and output to its store (the
    machine identity's credentials), so the controller learns the exit code of a process it
    cannot see."""
    from spotwise.storage import open_storage

    parser = argparse.ArgumentParser(prog="python -m spotwise.control.providers.remote_boot report")
    parser.add_argument("uri")
    parser.add_argument("--exit-code", type=int, required=True)
    parser.add_argument("--started", type=float, required=True)
    parser.add_argument("--stopping", type=int, default=0, help="1: the machine was shutting down")
    parser.add_argument("--log", type=Path)
    args = parser.parse_args(argv)
    store = open_storage(args.uri)
    if args.log is not None and args.log.exists():
        store.put("output.log", args.log.read_bytes())
        sys.stdout.write(args.log.read_text(errors="replace")[-4000:])  # the console log
    record = {
        "exit_code": args.exit_code,
        "started_at": args.started,
        "ended_at": time.time(),
        "stopping": bool(args.stopping),
    }
    store.put("exit.json", json.dumps(record).encode())
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] != ["report"]:
        sys.exit("usage: python -m spotwise.control.providers.remote_boot report URI --exit-code N")
    sys.exit(report(sys.argv[2:]))
