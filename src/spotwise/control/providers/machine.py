"""The sim provider's ``notice: aws`` machine: ``machine.sh`` with an EC2 metadata service.

A machine is ``machine.sh`` (see there and ``process.py``): a shell, not a Python interpreter,
per attempt. Only a machine whose notice comes as on EC2 (``spot/instance-action`` on IMDS)
needs Python: this wrapper serves a loopback IMDS emulator to the attempt, runs the shell machine
(which keeps the protocol: lock, ``machine.json``, ``exit.json``, the loss, a stop), and posts
the notice on IMDS when the shell machine signals it (SIGUSR1) at the notice's time. A SIGTERM
to this wrapper (a stop right after launch, before ``machine.json`` names the shell) is passed
on to the shell machine.

Run as ``python -m spotwise.control.providers.machine --lead-s S -- MACHINE_SH_ARGV...``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), which
    tells a live process from a new one that reused its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--lead-s", type=float, required=True, help="the notice's lead")
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("machine", nargs=argparse.REMAINDER, help="-- machine.sh's argv")
    args = parser.parse_args(argv)
    machine = args.machine[1:] if args.machine[:1] == ["--"] else args.machine
    from spotwise.emulators import AwsImdsEmulator

    imds = AwsImdsEmulator(port=0, lead_s=args.lead_s)
    env = {
        **os.environ,
        "AWS_EC2_METADATA_SERVICE_ENDPOINT": imds.start(),
        "SPOTWISE_PLATFORM": "aws",
    }

    def notice(*_: object) -> None:
        with open(args.log, "ab") as log:
            log.write(b"[spotwise] interruption notice: AWS spot/instance-action\n")
        imds.trigger_notice()

    shell: list[subprocess.Popen[bytes]] = []
    stops: list[int] = []

    def stop(*_: object) -> None:
        stops.append(signal.SIGTERM)
        for s in shell:
            s.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGUSR1, notice)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:  # (the shell's input is this wrapper's: the attempt's lock)
        shell.append(
            subprocess.Popen(machine, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        )
        if stops:  # (a stop that came as it started)
            shell[0].send_signal(signal.SIGTERM)
        shell[0].wait()
    finally:
        imds.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
