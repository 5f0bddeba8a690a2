"""``spotwise run -- CMD``: any program as the training process, notices forwarded to it.

The wrapper is one more consumer of the notice watcher (``watch_from_environment``, the same
detectors as ``spotwise.Run``): on a terminate notice it sends the program's process group the
signal the user chose, writes ``$SPOTWISE_NOTICE_FILE`` (JSON: source, kind, deadline), gives the
program until the notice's deadline, then SIGKILLs what is left, and exits 75 so the controller
relaunches. Without a notice it exits with the program's own code.

What "the program" is, and how nothing of it is left behind (Linux):
- it starts in a session and process group of its own; a signal sent to the wrapper's group (a
  terminal's Ctrl-C, ``kill -TERM -PGID``) reaches only the wrapper, which decides what to pass
  on, and what it passes on goes to the program's group (one ``killpg``) and to each process the
  program started outside it (``setsid``), so every process gets it exactly once;
- the wrapper is a child subreaper (``PR_SET_CHILD_SUBREAPER``): a process of the program whose
  parent died is re-parented to the wrapper rather than to init, so every process the program
  started stays below the wrapper, where ``/proc/*/task/*/children`` finds it;
- the attempt ends when the program's first process has ended *and* nothing it started is left:
  after a notice the rest has until the deadline; without one, leftovers get SIGTERM and
  ``SPOTWISE_GRACE_S``; then SIGKILL;
- a SIGKILLed wrapper cannot act, so a forked watchdog in a session of its own waits on a pipe
  only the wrapper holds: when it reads end-of-file without the wrapper's "done", the wrapper is
  gone, and it SIGKILLs the program's process group (not processes that left the group: only a
  live wrapper can find those).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from spotwise import settings
from spotwise.checkpoint.durable import write_atomic
from spotwise.errors import ConfigError
from spotwise.exitcode import EXIT_INTERRUPTED
from spotwise.notices.base import Notice, NoticeSource
from spotwise.notices.signals import grace_from_env
from spotwise.proctree import descendants, proc_state

# The wrapper's own notices: SIGUSR1 too (SLURM's ``--signal``), which would otherwise kill it
WRAPPER_SIGNALS = "TERM,INT,USR1"
POLL_S = 0.05  # how often the wrapper looks at notices and at the program
KILL_MARGIN_S = 1.0  # the group is killed this long before the deadline (at most 1/10 of it)
EXIT_NOT_FOUND = 127  # the shell's codes for a command that is not there
EXIT_CANNOT_RUN = 126  # ... and for one that is there but cannot be executed
EXIT_ABORTED = 130  # a second Ctrl-C: stop everything now, as a shell reports Ctrl-C
_PR_SET_CHILD_SUBREAPER = 36
_UNCATCHABLE = ("KILL", "STOP")


def forward_signal(name: str) -> signal.Signals:
    """``"TERM"``, ``"SIGUSR1"``, ``"int"``... -> the signal ``--signal`` names."""
    bare = name.strip().upper().removeprefix("SIG")
    try:
        sig = signal.Signals[f"SIG{bare}"]
    except KeyError:
        raise ConfigError(
            f"--signal {name!r} is not a signal name", hint="e.g. --signal TERM, INT or USR1"
        ) from None
    if bare in _UNCATCHABLE:
        raise ConfigError(
            f"--signal {name!r} cannot be caught, so the program could not save",
            hint="forward a signal it can handle (TERM, INT, USR1); after the notice's grace "
            "its group gets SIGKILL anyway",
        )
    return sig


class NoticeFile:
    """``$SPOTWISE_NOTICE_FILE`` for the program: absent until a notice, then its JSON.

    A path the user set is used (a stale file from an earlier attempt is removed first);
    otherwise the file lives in a fresh private directory removed at the end."""

    def __init__(self, env: Mapping[str, str]) -> None:
        given = settings.NOTICE_FILE.raw(env)
        self.private_dir: Path | None = None
        if given:
            self.path = Path(given)
        else:
            self.private_dir = Path(tempfile.mkdtemp(prefix="spotwise-"))
            self.path = self.private_dir / "notice.json"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"{settings.NOTICE_FILE.name}={given!r} cannot be written: {exc.strerror or exc}",
                hint="set it to a file in a writable directory, or unset it (then a private "
                "temporary file is used)",
            ) from None
        self.written: Notice | None = None

    def write(self, notice: Notice, forwarded: signal.Signals | None) -> None:
        """Replace the file atomically, so the program never reads half of it."""
        now_mono, now_wall = time.monotonic(), time.time()
        left = None if notice.deadline_monotonic is None else notice.deadline_monotonic - now_mono
        doc = {
            "source": notice.source,
            "kind": notice.kind.value,
            "action": notice.action,
            "received_unix": now_wall - (now_mono - notice.received_monotonic),
            "deadline_unix": None if left is None else now_wall + left,
            "deadline_monotonic": notice.deadline_monotonic,
            "signal": None if forwarded is None else forwarded.name,
        }
        write_atomic(self.path, (json.dumps(doc) + "\n").encode())
        self.written = notice

    def close(self) -> None:
        remove_private_dir(self.private_dir)


def remove_private_dir(path: Path | None) -> None:
    """Remove the notice file's private directory (it holds only files the wrapper wrote)."""
    if path is None:
        return
    with contextlib.suppress(OSError):
        for leftover in path.iterdir():
            leftover.unlink(missing_ok=True)
        path.rmdir()


class Watchdog:
    """Kills the program's process group if the wrapper dies without saying it is done.

    Forked before the watcher's threads start; the pipe's write end is close-on-exec and held
    only by the wrapper, so the kernel closes it when the wrapper dies, however it dies. It also
    removes the notice file's private directory the dead wrapper can no longer remove."""

    def __init__(self, private_dir: Path | None) -> None:
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(write_fd)
            _watch(read_fd, private_dir)  # never returns
        os.close(read_fd)
        self.pid = pid
        self._fd = write_fd

    def guard(self, pgid: int) -> None:
        os.write(self._fd, f"{pgid}\n".encode())

    def release(self) -> None:
        """The program is gone: the watchdog exits without killing anything."""
        with contextlib.suppress(OSError):
            os.write(self._fd, b"done\n")
        os.close(self._fd)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)


def _watch(read_fd: int, private_dir: Path | None) -> None:
    """The watchdog's whole life (in the forked child): wait for end-of-file, then act."""
    try:
        os.setsid()  # out of the wrapper's group: a group kill of the wrapper must not reach it
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(sig, signal.SIG_IGN)  # SLURM signals every process of the step
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)  # keep stderr only, for the one line below
        os.closerange(3, read_fd)
        os.closerange(read_fd + 1, os.sysconf("SC_OPEN_MAX"))
        said = b""
        while chunk := os.read(read_fd, 64):
            said += chunk
        words = said.split()
        if words and words[-1] != b"done":
            pgid = int(words[0])
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
                os.write(2, f"spotwise run: wrapper gone; killed group {pgid}\n".encode())
        if not words or words[-1] != b"done":
            remove_private_dir(private_dir)
    finally:
        os._exit(0)


def become_subreaper() -> bool:
    """Make orphans of the program this process's children (Linux 3.4+); False elsewhere."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def exit_code(status: int) -> int:
    """A wait status as a shell reports it: the exit code, or 128 + the killing signal."""
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


def _say(message: str) -> None:
    print(f"spotwise run: {message}", file=sys.stderr, flush=True)


class Supervisor:
    """One program under supervision: started, watched, signalled, killed and reaped."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        forward: signal.Signals,
        notices: NoticeSource,
        notice_file: NoticeFile,
        watchdog: Watchdog,
        env: Mapping[str, str],
    ) -> None:
        self.forward = forward
        self.notices = notices
        self.notice_file = notice_file
        self.watchdog = watchdog
        self.leftover_grace_s = grace_from_env(env)
        self.pid = os.posix_spawnp(
            argv[0],
            list(argv),
            {**env, settings.NOTICE_FILE.name: str(notice_file.path)},
            setsid=True,
            # what subprocess restores too: Python ignores SIGPIPE, SIGXFSZ; and the signal
            # forwarded must not be ignored because the wrapper's own parent ignored it
            setsigdef=(signal.SIGPIPE, signal.SIGXFSZ, forward),
        )
        watchdog.guard(self.pid)
        self.status: int | None = None  # the program's first process's wait status
        self.noticed: Notice | None = None  # the terminate notice forwarded, if any
        self.interrupted = False  # a terminate notice came before the program ended
        self.kill_at = float("inf")

    # --- the loop ------------------------------------------------------------------------------
    def run(self) -> int:
        """Supervise until nothing of the program is left; the attempt's exit code."""
        try:
            while self.status is None or self.remaining():
                self._reap()
                self._look_at_notices()
                if self.status is not None and self.kill_at == float("inf"):
                    self._end_leftovers()
                if time.monotonic() >= self.kill_at:
                    self._kill_all("the grace is over")
                time.sleep(POLL_S)
        except KeyboardInterrupt:  # the second Ctrl-C: stop now
            self._kill_all("interrupted twice")
            return EXIT_ABORTED
        finally:
            self._kill_all("the program ended")  # whatever appeared in the last instant
        if self.noticed is not None:
            self.notices.acknowledge(self.noticed)  # Azure: the event may start now
        assert self.status is not None
        return EXIT_INTERRUPTED if self.interrupted else exit_code(self.status)

    def remaining(self) -> list[int]:
        """The program's processes still running (the watchdog is not one of them)."""
        return [p for p in descendants(os.getpid(), running=True) if p != self.watchdog.pid]

    # --- steps -----------------------------------------------------------------------------------
    def _reap(self) -> None:
        """Collect every ended child: the program, and orphans re-parented to this process."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.pid:
                self.status = status
                self.interrupted = self.noticed is not None

    def _look_at_notices(self) -> None:
        notice = self.notices.current()
        if notice is None or notice == self.notice_file.written:
            return
        if not notice.is_terminate:  # advisory (AWS rebalance): the file only, no signal
            if self.noticed is None:
                self._write_file(notice, None)
                _say(f"advisory notice from {notice.source} ({notice.action}): {self._file()}")
            return
        if self.noticed is not None:
            return
        self.noticed = notice
        self._write_file(notice, self.forward)
        now = time.monotonic()
        deadline = notice.deadline_monotonic
        if deadline is None:
            deadline = notice.received_monotonic + self.leftover_grace_s
        left = max(0.0, deadline - now)
        self.kill_at = now + left - min(KILL_MARGIN_S, left / 10)
        _say(
            f"notice from {notice.source} ({notice.action}), {left:.0f} s left: "
            f"{self.forward.name} to the program, {self._file()}"
        )
        self._signal_program(self.forward)

    def _end_leftovers(self) -> None:
        """The program ended without a notice but left processes: SIGTERM, then the grace."""
        left = self.remaining()
        if not left:
            return
        _say(
            f"the program ended and left {len(left)} process(es): SIGTERM, SIGKILL after "
            f"{self.leftover_grace_s:g} s"
        )
        self._signal_program(signal.SIGTERM)
        self.kill_at = time.monotonic() + self.leftover_grace_s

    def _kill_all(self, why: str) -> None:
        """SIGKILL the program's group and every process below this one, then reap them."""
        for attempt in range(100):  # a pass kills one more generation of re-parented orphans
            left = self.remaining()
            if not left and self.status is not None:
                return
            if attempt == 0:
                _say(f"{why}: SIGKILL to {len(left)} process(es) of the program")
            self._signal_program(signal.SIGKILL)
            time.sleep(0.01)
            self._reap()

    def _signal_program(self, sig: signal.Signals) -> None:
        """Signal the program's process group, and each process it started outside the group
        (``setsid``): every process gets the signal once. The group is signalled only while a
        process of it runs: its id is the first process's pid, which is reused once it is empty."""
        in_group = self.status is None  # its first process is still there (maybe a zombie)
        for pid in self.remaining():
            state = proc_state(pid)
            if state is not None and state[1] == self.pid:
                in_group = True
            else:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        if in_group:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)

    def _write_file(self, notice: Notice, forwarded: signal.Signals | None) -> None:
        """The file before the signal (a handler may read it); a full disk must not stop the
        signal."""
        try:
            self.notice_file.write(notice, forwarded)
        except OSError as exc:
            _say(f"cannot write {self._file()}: {exc.strerror or exc}")

    def _file(self) -> str:
        return f"{settings.NOTICE_FILE.name}={self.notice_file.path}"


def run_program(
    argv: Sequence[str], *, forward: signal.Signals, env: Mapping[str, str] | None = None
) -> int:
    """Run ``argv`` under notice supervision; the exit code for the controller (75: relaunch)."""
    from spotwise.notices.watcher import watch_from_environment

    env = dict(os.environ if env is None else env)
    notice_file = NoticeFile(env)
    watchdog = Watchdog(notice_file.private_dir)  # before any thread exists: it is forked
    become_subreaper()
    notices = watch_from_environment(
        {**env, settings.SIGNALS.name: settings.SIGNALS.raw(env) or WRAPPER_SIGNALS}
    )
    try:
        try:
            supervisor = Supervisor(
                argv,
                forward=forward,
                notices=notices,
                notice_file=notice_file,
                watchdog=watchdog,
                env=env,
            )
        except OSError as exc:
            _say(f"cannot start {argv[0]!r}: {exc.strerror or exc}")
            return EXIT_NOT_FOUND if isinstance(exc, FileNotFoundError) else EXIT_CANNOT_RUN
        return supervisor.run()
    finally:
        watchdog.release()
        notices.close()
        notice_file.close()
