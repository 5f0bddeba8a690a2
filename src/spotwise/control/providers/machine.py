"""A "machine" for the local and sim providers: a small supervisor process around one attempt.

It outlives the controller (own session), so a controller killed with SIGKILL leaves the job
running and finds it again. It holds an exclusive ``flock`` on the attempt's ``lock`` file for
its whole life (inherited from the controller at fork, so there is no unlocked window), writes
``machine.json`` (its pid and start time, the training process's pid) and, at the end,
``exit.json`` (exit code, how it ended, when), which is how a restarted controller learns the
outcome of a process that is not its child.

On the sim provider it also plays the platform: at ``--notice-at`` it sends the notice signal
(SIGTERM) to the training process, and at ``--lost-at`` the machine is taken away (SIGKILL to the
training process group). A SIGTERM to the machine itself (terminate/cancel) does the same with
the grace period starting now. The log says which it was: the platform's ``interruption notice``
or the controller's ``stop requested`` (e.g. the other nodes of an attempt that lost one), so a
node that got no notice is never reported as noticed.

Run as ``python -m spotwise.control.providers.machine --dir DIR [...] -- COMMAND...``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from spotwise.checkpoint.durable import write_atomic
from spotwise.proctree import descendants


def proc_start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), which
    tells a live process from a new one that reused its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def write_json_atomic(path: Path, doc: dict[str, Any]) -> None:
    write_atomic(path, json.dumps(doc).encode())


def _sleep_until_event(ended: int, woken: int, deadline: float | None) -> None:
    """Wait until ``ended`` (the command's pidfd) is readable, a signal arrives (``woken``: the
    signal wakeup pipe) or ``deadline`` passes: the supervisor never polls (a sim benchmark
    runs a thousand of these machines on two cores)."""
    timeout = None if deadline is None else max(0.0, deadline - time.time())
    ready, _, _ = select.select([ended, woken], [], [], timeout)
    if woken in ready:
        with contextlib.suppress(BlockingIOError):
            os.read(woken, 512)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return


def _kill_tree(pid: int) -> None:
    """Take the machine away: SIGKILL the command's group and everything it started."""
    below = descendants(pid)  # before the kill: orphans would leave the tree
    _kill_group(pid, signal.SIGKILL)
    for p in below:
        _kill_group(p, signal.SIGKILL)
        try:
            os.kill(p, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--log", required=True, type=Path)
    parser.add_argument("--lock-fd", type=int, default=-1)
    parser.add_argument("--boot-s", type=float, default=0.0)
    parser.add_argument("--notice-at", type=float, default=None)
    parser.add_argument("--lost-at", type=float, default=None)
    parser.add_argument("--grace-s", type=float, default=30.0)
    parser.add_argument("--banner", default="")
    parser.add_argument("--notice-via", choices=["sigterm", "aws"], default="sigterm")
    parser.add_argument("--code", default=None, help="a packed workdir: <store>/<sha256>.tar.gz")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    state: dict[str, Any] = {"pid": os.getpid(), "start_ticks": proc_start_ticks(os.getpid())}
    machine_file = args.dir / "machine.json"
    write_json_atomic(machine_file, state)

    stop_at: list[float] = []  # set by a terminate request (SIGTERM to this machine)
    signal.signal(signal.SIGTERM, lambda *_: stop_at.append(time.time()))
    woken, wake = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake)  # a signal also ends the wait in _sleep_until_event
    signal.signal(signal.SIGINT, signal.SIG_IGN)

    def finish(outcome: str, code: int | None) -> int:
        write_json_atomic(
            args.dir / "exit.json", {"outcome": outcome, "exit_code": code, "ended_at": time.time()}
        )
        return 0

    boot_end = time.time() + args.boot_s
    while time.time() < boot_end:  # provisioning: the machine is billed but not yet running
        if stop_at:
            return finish("terminated", None)
        if args.lost_at is not None and time.time() >= args.lost_at:
            return finish("lost", None)
        time.sleep(0.02)

    env, imds = dict(os.environ), None
    if args.notice_via == "aws":  # the notice arrives as on EC2: IMDS spot/instance-action
        from spotwise.emulators import AwsImdsEmulator

        imds = AwsImdsEmulator(port=0, lead_s=max(0.0, (args.lost_at or 0) - (args.notice_at or 0)))
        env.update(AWS_EC2_METADATA_SERVICE_ENDPOINT=imds.start(), SPOTWISE_PLATFORM="aws")
    try:
        return _supervise(args, command, env, imds, state, machine_file, stop_at, woken, finish)
    finally:
        if imds is not None:
            imds.stop()


def _supervise(
    args: argparse.Namespace,
    command: list[str],
    env: dict[str, str],
    imds: Any,
    state: dict[str, Any],
    machine_file: Path,
    stop_at: list[float],
    woken: int,
    finish: Any,
) -> int:
    with open(args.log, "ab", buffering=0) as log:
        if args.banner:
            log.write(f"[spotwise] {args.banner}\n".encode())
        cwd = None
        if args.code is not None:  # the job's code, unpacked on this machine before it runs
            from spotwise.control.workdir import CodeArchive, fetch_and_unpack

            cwd = args.dir / "workdir"
            try:
                fetch_and_unpack(CodeArchive.parse(args.code), cwd)
            except Exception as exc:  # the attempt ends as an error that says why
                why = getattr(exc, "message", None) or f"{type(exc).__name__}: {exc}"
                log.write(f"[spotwise] workdir: cannot unpack {args.code}: {why}\n".encode())
                return int(finish("exited", 1))
        try:
            child = subprocess.Popen(
                command,
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            log.write(f"[spotwise] cannot start {command[:1]}: {exc}\n".encode())
            return int(finish("exited", 127))
        state.update(
            child_pid=child.pid,
            child_start_ticks=proc_start_ticks(child.pid),
            running_at=time.time(),
        )
        write_json_atomic(machine_file, state)

        notice_at, lost_at, noticed, outcome = args.notice_at, args.lost_at, False, "exited"
        ended = os.pidfd_open(child.pid)  # readable once the command has exited
        while True:
            upcoming = [t for t in (None if noticed else notice_at, lost_at) if t is not None]
            _sleep_until_event(ended, woken, min(upcoming, default=None))
            code = child.poll()
            if code is not None:
                break
            now = time.time()
            if stop_at and not noticed:
                outcome = "terminated"
                notice_at, lost_at = now, min(lost_at or float("inf"), now + args.grace_s)
            if notice_at is not None and now >= notice_at and not noticed:
                noticed = True
                if imds is not None and not stop_at:
                    log.write(b"[spotwise] interruption notice: AWS spot/instance-action\n")
                    imds.trigger_notice()
                else:
                    why = "stop requested" if stop_at else "interruption notice"
                    log.write(f"[spotwise] {why}: SIGTERM\n".encode())
                    child.send_signal(signal.SIGTERM)
            if lost_at is not None and now >= lost_at:
                log.write(b"[spotwise] machine taken away: SIGKILL\n")
                _kill_tree(child.pid)
                child.wait()
                return int(finish("lost" if outcome == "exited" else outcome, None))
        _kill_tree(child.pid)  # leave nothing behind on the "machine"
        if code in (0, 75):
            return int(finish("exited", code))
        # Died of the notice itself (e.g. before its handler was installed): the platform's
        # doing, not the command's, so it is a lost machine and not a user error.
        return int(
            finish(outcome if outcome == "terminated" else "lost" if noticed else "exited", code)
        )


if __name__ == "__main__":
    sys.exit(main())
