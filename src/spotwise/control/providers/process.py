"""Attempts as local supervised processes ("machines"), shared by the local and sim providers.

An attempt on several nodes is one machine per node (``<attempt_dir>/node-<k>/``), each running
torch's launcher; its status is the nodes' statuses folded by :func:`group_status`.

Liveness comes from the machine's ``flock`` on ``<attempt_dir>/lock``, not from pids: the lock
exists exactly as long as the machine process, so pid reuse cannot fool it, and the controller
takes it *before* forking, so there is no instant at which a machine runs unlocked.

A machine is started with ``posix_spawn``, its signals at their defaults: a shell cannot trap a
signal that was ignored when it started (POSIX), and a controller that was itself told to ignore
SIGTERM would pass that on through ``subprocess``. Such a machine ignored terminate and ran its
command to the end (a paid machine left running after a cancel), and its notice and its loss.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from spotwise.control.providers.base import AttemptStatus, Handle, LaunchRequest, Phase
from spotwise.control.providers.machine import proc_start_ticks
from spotwise.control.providers.torchrun import free_port, launcher_argv
from spotwise.errors import ProviderError
from spotwise.exitcode import EXIT_INTERRUPTED


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError):  # half-written files are replaced atomically
        return None


def take_lock(fd: int, patience_s: float = 0.2) -> bool:
    """Take ``fd``'s exclusive ``flock``; False if a holder keeps it. :func:`lock_held` looks by
    taking the lock for an instant, so a refusal is retried for ``patience_s`` before it counts:
    a look must never turn away the process whose lock it is."""
    deadline = time.monotonic() + patience_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.01)


def lock_held(lock_path: Path) -> bool:
    """Whether some process (the machine) holds the attempt's lock."""
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


# What the machine acts on (its traps), and what Python ignores in itself (as subprocess restores)
_MACHINE_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGPIPE, signal.SIGXFSZ)
_spawned: set[int] = set()  # machines this process started and has not collected yet


def _collect_ended(pids: Sequence[int], *, exiting: bool = False) -> None:
    """Reap those of ``pids`` (machines this process started) that have ended: with posix_spawn
    that is left to the parent (subprocess did it at the next Popen), and a server starts
    thousands. A status reaps its own machine once it has seen the end (``exiting``: its lock
    is released, so it has closed its files and is leaving, and the wait is a moment); a launch
    collects any others."""
    for pid in pids:
        if pid not in _spawned:
            continue
        try:
            ended, _ = os.waitpid(pid, 0 if exiting else os.WNOHANG)
        except ChildProcessError:  # reaped by another thread meanwhile
            ended = pid
        if ended:
            _spawned.discard(pid)


def _signal_if_same(pid: int | None, ticks: int | None, sig: int, group: bool = False) -> None:
    """Signal a process only if it is still the one we started (same start time)."""
    if not pid or proc_start_ticks(pid) != ticks:
        return
    try:
        os.killpg(pid, sig) if group else os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return


class ProcessMachines:
    """Start, observe and stop machine processes (see ``machine.py``).

    ``settle_s``: how long the other nodes of an attempt get to end by themselves after one
    exited 75 before they are stopped (see :func:`group_status`)."""

    def __init__(self, settle_s: float) -> None:
        self.settle_s = settle_s

    def launch(
        self,
        req: LaunchRequest,
        *,
        boot_s: float = 0.0,
        notice_at: float | None = None,
        lost_at: float | None = None,
        banner: str = "",
        notice_via: str = "sigterm",
    ) -> Handle:
        req.attempt_dir.mkdir(parents=True, exist_ok=True)
        for stale in ("exit.json", "machine.json"):
            (req.attempt_dir / stale).unlink(missing_ok=True)
        lock_path = req.attempt_dir / "lock"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        if not take_lock(fd):
            os.close(fd)
            raise ProviderError(f"attempt {req.key} is already running")
        cwd = req.attempt_dir if req.code is not None else req.workdir
        if not Path(cwd).is_dir():
            os.close(fd)
            raise ProviderError(
                f"cannot start attempt {req.key}: {cwd} is not a directory",
                hint=f"check the working directory {req.workdir}",
            )
        cmd = _machine_argv(req, cwd, boot_s, notice_at, lost_at, banner, notice_via)
        _collect_ended(list(_spawned))
        try:
            pid = os.posix_spawn(
                cmd[0],
                cmd,
                req.env,
                # the machine holds the lock as its input (see machine.sh)
                file_actions=[
                    (os.POSIX_SPAWN_DUP2, fd, 0),
                    (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                    (os.POSIX_SPAWN_DUP2, 1, 2),
                ],
                setsid=True,
                setsigdef=_MACHINE_SIGNALS,
            )
        except OSError as exc:
            raise ProviderError(
                f"cannot start attempt {req.key}: {exc}",
                hint=f"check the working directory {req.workdir}",
            ) from exc
        finally:
            os.close(fd)  # the machine keeps the lock alive through its inherited descriptor
        _spawned.add(pid)
        return {
            "n": req.n,
            "id": str(req.attempt_dir),
            "dir": str(req.attempt_dir),
            "pid": pid,
            "start_ticks": proc_start_ticks(pid),
        }

    def launch_nodes(self, req: LaunchRequest, per_node: Sequence[dict[str, Any]]) -> Handle:
        """Start ``req`` as one machine per node (``per_node[k]``: that machine's ``launch``
        arguments), or as one machine when the attempt is a single process.

        Several processes run through torch's launcher; several nodes meet at a c10d store on
        127.0.0.1 that node 0 serves. A node that fails to start stops the ones already up."""
        world = req.nodes * req.procs_per_node
        if world == 1:
            return self.launch(req, **per_node[0])
        endpoint = f"127.0.0.1:{free_port()}"
        started: list[Handle] = []
        try:
            for k, kwargs in enumerate(per_node):
                argv = launcher_argv(
                    req.argv,
                    python=sys.executable,
                    nodes=req.nodes,
                    procs_per_node=req.procs_per_node,
                    endpoint=endpoint,
                    rdzv_id=req.key,
                    host=k == 0,
                )
                node = replace(req, argv=argv, attempt_dir=req.attempt_dir / f"node-{k}")
                started.append(self.launch(node, **kwargs))
        except BaseException:
            for handle in started:
                self.terminate(handle)
            raise
        return _group(req.n, req.attempt_dir, started)

    def find(self, attempts_dir: Path) -> list[Handle]:
        """Machines of a job's attempts (``attempts_dir/<n>/``) that live or left an outcome."""
        found = []
        for d in sorted(attempts_dir.glob("*"), key=lambda p: p.name):
            if not d.name.isdigit():
                continue
            node_dirs = sorted(d.glob("node-*"), key=lambda p: int(p.name.removeprefix("node-")))
            if node_dirs:
                nodes = [self._find_one(nd, int(d.name)) for nd in node_dirs]
                if any(h is not None for h in nodes):
                    found.append(
                        _group(
                            int(d.name),
                            d,
                            [h or _gone(nd) for h, nd in zip(nodes, node_dirs, strict=True)],
                        )
                    )
            elif (handle := self._find_one(d, int(d.name))) is not None:
                found.append(handle)
        return found

    def _find_one(self, d: Path, n: int) -> Handle | None:
        if lock_held(d / "lock") or (d / "exit.json").exists():
            for _ in range(200):  # a machine that just started writes machine.json at once
                machine = _read_json(d / "machine.json")
                if machine is not None:
                    return {
                        "n": n,
                        "id": str(d),
                        "dir": str(d),
                        "pid": machine["pid"],
                        "start_ticks": machine["start_ticks"],
                    }
                if not lock_held(d / "lock"):
                    break
                time.sleep(0.05)
            return {"n": n, "id": str(d), "dir": str(d), "pid": None, "start_ticks": None}
        return None

    def status(self, handle: Handle) -> AttemptStatus:
        if "nodes" in handle:
            statuses = [self.status(h) for h in handle["nodes"]]
            status, stop_rest = group_status(statuses, now=time.time(), settle_s=self.settle_s)
            if stop_rest:  # one node lost or failed: the attempt is over, end the others too
                for h, st in zip(handle["nodes"], statuses, strict=True):
                    if st.phase in (Phase.STARTING, Phase.RUNNING):
                        self.terminate(h)
            return status
        status = self._machine_status(handle)
        if status.phase in (Phase.EXITED, Phase.LOST) and handle.get("pid"):
            _collect_ended([handle["pid"]], exiting=True)
        return status

    def _machine_status(self, handle: Handle) -> AttemptStatus:
        d = Path(handle["dir"])
        end = _read_json(d / "exit.json")
        machine = _read_json(d / "machine.json") or {}
        running_at = machine.get("running_at")
        if end is not None and lock_held(d / "lock"):
            # the outcome is written, the machine is still leaving (killing what is left of the
            # command): ended only once nothing of it runs any more
            return AttemptStatus(Phase.RUNNING, running_at=running_at, detail="finishing")
        if end is not None:
            killed = end["outcome"] == "terminated" and (end["exit_code"] or 0) < 0
            if end["outcome"] == "lost" or end["exit_code"] is None or killed:
                # (killed: the stop signal reached it before it could handle it and save)
                return AttemptStatus(
                    Phase.LOST,
                    exit_code=end["exit_code"],
                    ended_at=end["ended_at"],
                    running_at=running_at,
                    detail=end["outcome"],
                )
            return AttemptStatus(
                Phase.EXITED,
                exit_code=end["exit_code"],
                ended_at=end["ended_at"],
                running_at=running_at,
            )
        if lock_held(d / "lock"):
            phase = Phase.RUNNING if running_at else Phase.STARTING
            return AttemptStatus(phase, running_at=running_at)
        if _read_json(d / "exit.json") is not None:  # it finished between the two reads
            return self._machine_status(handle)
        # The machine died without a word (killed, host gone): clean up what it left.
        _signal_if_same(
            machine.get("child_pid"), machine.get("child_start_ticks"), signal.SIGKILL, group=True
        )
        return AttemptStatus(
            Phase.LOST, ended_at=None, running_at=running_at, detail="machine process vanished"
        )

    def end_fd(self, handle: Handle) -> int | None:
        """A descriptor (pidfd) that becomes readable when the attempt's machine process has
        ended, its outcome written: how a controller learns of the end without polling. None
        for an attempt on several machines, or a machine already gone (the next ``status``
        tells)."""
        pid = handle.get("pid")
        if "nodes" in handle or not pid:
            return None
        try:
            fd = os.pidfd_open(pid)
        except OSError:
            return None
        if proc_start_ticks(pid) != handle.get("start_ticks"):  # the pid was reused
            os.close(fd)
            return None
        return fd

    def terminate(self, handle: Handle) -> None:
        if "nodes" in handle:
            for h in handle["nodes"]:
                self.terminate(h)
            return
        d = Path(handle["dir"])
        # machine.json may not be written yet right after launch: the handle knows the pid too
        machine = _read_json(d / "machine.json") or {
            "pid": handle.get("pid"),
            "start_ticks": handle.get("start_ticks"),
        }
        if lock_held(d / "lock"):
            _signal_if_same(machine.get("pid"), machine.get("start_ticks"), signal.SIGTERM)
        else:
            _signal_if_same(
                machine.get("child_pid"),
                machine.get("child_start_ticks"),
                signal.SIGKILL,
                group=True,
            )


MACHINE_SH = Path(__file__).with_name("machine.sh")


def _machine_argv(
    req: LaunchRequest,
    cwd: Path,
    boot_s: float,
    notice_at: float | None,
    lost_at: float | None,
    banner: str,
    notice_via: str,
) -> list[str]:
    """The machine's command: ``machine.sh``, inside ``machine.py`` when the notice comes on a
    loopback EC2 metadata service that it serves (``notice_via="aws"``)."""
    shell = [
        "/bin/sh",
        str(MACHINE_SH),
        str(req.attempt_dir),
        str(req.log_path),
        repr(req.grace_s),
        repr(boot_s),
        "-" if notice_at is None else repr(notice_at),
        "-" if lost_at is None else repr(lost_at),
        banner,
        "-" if req.code is None else str(req.code),
        sys.executable,
        "sigterm" if notice_via == "sigterm" else "parent",
        str(cwd),
        "--",
        *req.argv,
    ]
    if notice_via == "sigterm":
        return shell
    lead_s = max(0.0, (lost_at or 0.0) - (notice_at or 0.0))
    return [
        sys.executable,
        "-m",
        "spotwise.control.providers.machine",
        "--lead-s",
        repr(lead_s),
        "--log",
        str(req.log_path),
        "--",
        *shell,
    ]


def _group(n: int, attempt_dir: Path, nodes: list[Handle]) -> Handle:
    return {"n": n, "id": str(attempt_dir), "dir": str(attempt_dir), "nodes": nodes}


def _gone(node_dir: Path) -> Handle:
    """A node's machine that left nothing to find (never started, or its files are gone)."""
    return {"n": 0, "id": str(node_dir), "dir": str(node_dir), "pid": None, "start_ticks": None}


def _failed(st: AttemptStatus) -> bool:
    return st.phase is Phase.LOST or (st.phase is Phase.EXITED and st.exit_code != 0)


def group_status(
    statuses: Sequence[AttemptStatus], *, now: float, settle_s: float
) -> tuple[AttemptStatus, bool]:
    """One status for an attempt from its nodes' statuses, and whether to stop the nodes still
    up (pure).

    The attempt holds every node: one lost or failed ends it, so the rest are stopped (their
    ranks get the notice and save). A node that exited 75 is the exception for ``settle_s``
    after its end: its ranks saved because the agreement made every rank save, so the others
    are on their way out, and a SIGTERM then could kill a rank that is already exiting and turn
    the preemption into an error; only nodes still up after that (a notice during the
    rendezvous, before any agreement) are stopped. Once all have ended, the node that ended
    first with anything but 0 is the root cause, as ``spotwise.runtime.launch`` does for
    ranks: a lost machine makes the attempt lost, 75 makes it interrupted unless another node
    exited with an error of its own (never hidden behind a preemption), an error code stays
    that error.
    """
    live = [st for st in statuses if st.phase in (Phase.STARTING, Phase.RUNNING)]
    failed = [st for st in statuses if _failed(st)]
    if live:
        starting = any(st.phase is Phase.STARTING for st in live)
        running = [st.running_at for st in statuses]
        settling = [
            st.phase is Phase.EXITED
            and st.exit_code == EXIT_INTERRUPTED
            and now - (st.ended_at or now) < settle_s
            for st in failed
        ]
        return AttemptStatus(
            Phase.STARTING if starting else Phase.RUNNING,
            running_at=None if starting or None in running else max(r for r in running if r),
            detail=f"{len(live)} of {len(statuses)} nodes up",
        ), not all(settling)
    ended_at = max((st.ended_at for st in statuses if st.ended_at is not None), default=None)
    running_at = max((st.running_at for st in statuses if st.running_at), default=None)
    if not failed:
        return AttemptStatus(Phase.EXITED, 0, ended_at, running_at), False
    first = min(failed, key=lambda st: st.ended_at if st.ended_at is not None else float("inf"))
    errors = [st for st in failed if st.phase is Phase.EXITED and st.exit_code != EXIT_INTERRUPTED]
    if first.phase is Phase.LOST:
        return AttemptStatus(
            Phase.LOST, first.exit_code, ended_at, running_at, detail=first.detail
        ), False
    if first.exit_code == EXIT_INTERRUPTED and errors:
        first = errors[0]
    return AttemptStatus(Phase.EXITED, first.exit_code, ended_at, running_at), False


class ProcessBacked:
    """``find`` / ``status`` / ``terminate`` of providers whose attempts are machine processes."""

    _machines: ProcessMachines

    def find(self, job_id: str, attempts_dir: Path) -> list[Handle]:
        return self._machines.find(attempts_dir)

    def status(self, handle: Handle) -> AttemptStatus:
        return self._machines.status(handle)

    def terminate(self, handle: Handle) -> None:
        self._machines.terminate(handle)

    def end_fd(self, handle: Handle) -> int | None:
        return self._machines.end_fd(handle)
