"""POSIX signals as notices: SIGTERM/SIGINT by default, SIGUSR1/SIGUSR2 on request.

The handler only records which signal came and when; everything else (deadline, logging,
saving) happens later at a step boundary, because a handler runs between two bytecodes of the
main thread and anything heavier there can deadlock or corrupt the state being saved.

A second SIGINT aborts: the first Ctrl-C asks for an emergency checkpoint and a clean exit 75,
a second Ctrl-C gives the user the previous behaviour back (normally ``KeyboardInterrupt``) so a
hung save can always be interrupted.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType
from typing import Any

from spotwise import settings
from spotwise.errors import NoticeError
from spotwise.notices.base import LogOnce, Notice, NoticeKind, most_urgent

log = logging.getLogger("spotwise.notices")

DEFAULT_SIGNALS = ("TERM", "INT")
DEFAULT_GRACE_S = 30.0  # Kubernetes terminationGracePeriodSeconds default
_KNOWN = ("TERM", "INT", "USR1", "USR2", "HUP", "QUIT")

# signal number -> how many detectors in this process turn it into notices right now
_watching: dict[int, int] = {}


def watched_signals() -> tuple[int, ...]:
    """The signals this process currently takes as notices. DataLoader workers ignore them
    (see :mod:`spotwise.runtime.workers`): when one is sent to the whole process group, only
    the training process must act on it."""
    return tuple(sorted(s for s, count in _watching.items() if count > 0))


def parse_signal_names(text: str) -> tuple[str, ...]:
    """``"TERM,INT,USR1"`` (``SIG`` prefix and case optional) -> ``("TERM", "INT", "USR1")``."""
    names: list[str] = []
    for raw in text.replace(" ", ",").split(","):
        if not raw:
            continue
        name = raw.upper().removeprefix("SIG")
        if name not in _KNOWN:
            raise NoticeError(
                f"unknown signal {raw!r} in {settings.SIGNALS.name}",
                hint=f"use a comma-separated list of {', '.join(_KNOWN)}, e.g. TERM,INT,USR1",
            )
        if name not in names:
            names.append(name)
    return tuple(names)


def grace_from_env(env: Mapping[str, str], default: float = DEFAULT_GRACE_S) -> float:
    """``SPOTWISE_GRACE_S``: seconds between a SIGTERM and the SIGKILL that follows it."""
    return settings.GRACE_S.seconds(env, default, error=NoticeError)


@dataclass(frozen=True)
class SignalRecord:
    signame: str  # "TERM", "USR1"...
    received_monotonic: float
    received_wall: float


class SignalDetector:
    """Records the watched signals and turns them into terminate notices.

    The deadline of a signal is its arrival plus ``grace_s``; platform variants (Kubernetes,
    SLURM) override :meth:`deadline_for`. Handlers can only be installed from the main thread;
    constructed elsewhere, the detector logs once and watches nothing (the metadata pollers
    still work), rather than failing the run.
    """

    name = "signal"
    poll_interval_s = 0.0  # no I/O: the watcher polls it synchronously in current()

    def __init__(
        self,
        signals: tuple[str, ...] | None = None,
        grace_s: float | None = None,
        *,
        env: Mapping[str, str] | None = None,
        source: str | None = None,
    ) -> None:
        env = os.environ if env is None else env
        self.signals = signals if signals is not None else self._signals_from_env(env)
        self.grace_s = grace_s if grace_s is not None else grace_from_env(env)
        if source is not None:
            self.name = source
        self._records: list[SignalRecord] = []  # list.append is atomic under the GIL
        self._previous: dict[int, Any] = {}
        self._cached: tuple[int, Notice | None] = (0, None)
        self._log = LogOnce(log)
        self.installed: tuple[str, ...] = self._install()

    @staticmethod
    def _signals_from_env(env: Mapping[str, str]) -> tuple[str, ...]:
        raw = settings.SIGNALS.raw(env)
        return parse_signal_names(raw) if raw else DEFAULT_SIGNALS

    def _install(self) -> tuple[str, ...]:
        if threading.current_thread() is not threading.main_thread():
            self._log(
                "off-main",
                "spotwise: notices created off the main thread; signals %s are not watched "
                "(create spotwise.Run in the main thread to catch them)",
                ",".join(self.signals),
            )
            return ()
        installed = []
        for name in self.signals:
            signum = getattr(signal, f"SIG{name}")
            self._previous[signum] = signal.signal(signum, self._handle)
            _watching[signum] = _watching.get(signum, 0) + 1
            installed.append(name)
        return tuple(installed)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name.removeprefix("SIG")
        if name == "INT" and any(r.signame == "INT" for r in self._records):
            self._abort(signum, frame)
            return
        self._records.append(SignalRecord(name, time.monotonic(), time.time()))

    def _abort(self, signum: int, frame: FrameType | None) -> None:
        """Second Ctrl-C: give the previous SIGINT behaviour back and apply it now."""
        if signum in self._previous:
            _watching[signum] -= 1  # no longer a notice: Ctrl-C acts as before
        previous = self._previous.pop(signum, signal.default_int_handler)
        signal.signal(signum, previous)
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            os.kill(os.getpid(), signum)

    @property
    def records(self) -> tuple[SignalRecord, ...]:
        return tuple(self._records)

    def deadline_for(self, record: SignalRecord) -> float:
        return record.received_monotonic + self.grace_s

    def notice_for(self, record: SignalRecord) -> Notice:
        return Notice(
            source=self.name,
            kind=NoticeKind.TERMINATE,
            received_monotonic=record.received_monotonic,
            deadline_monotonic=self.deadline_for(record),
            action=f"SIG{record.signame}",
            detail={"signal": f"SIG{record.signame}"},
        )

    def poll(self) -> Notice | None:
        count = len(self._records)
        if count != self._cached[0]:
            records = self._records[:count]
            notice = most_urgent(self.notice_for(r) for r in records)
            self._cached = (count, notice)
            if notice is not None:
                self._log.info(
                    f"got-{records[-1].signame}",
                    "spotwise: received SIG%s; emergency checkpoint at the next step boundary",
                    records[-1].signame,
                )
        return self._cached[1]

    def acknowledge(self, notice: Notice) -> None:
        """Signals need no acknowledgement."""

    def close(self) -> None:
        """Restore the handlers that were there before (only ours, only from the main thread)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in list(self._previous.items()):
            if signal.getsignal(signum) == self._handle:
                signal.signal(signum, previous)
            del self._previous[signum]
            _watching[signum] -= 1
