"""A torchrun rank whose agent is gone: one more notice source, and an end within the grace.

torch elastic's agent (``torchrun``, ``python -m spotwise.runtime.launch``) starts each rank in a
session of its own, so a kill of the agent's process group (``kill -9 -PGID``, a supervisor
giving up on it) leaves the ranks training on, holding the run directory, with nobody left to
hear their exit code. A Run in such a rank watches its parent, the agent, and takes its end as
a terminate notice, acted on like any other (the ranks agree, save, exit 75).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Mapping

from spotwise.exitcode import EXIT_INTERRUPTED
from spotwise.notices.base import Notice, NoticeKind, NoticeSource, most_urgent
from spotwise.notices.signals import grace_from_env

# torch elastic's agent (torchrun, python -m spotwise.runtime.launch) sets it in every worker
AGENT_ENV = "TORCHELASTIC_RUN_ID"
_AGENT_POLL_S = 0.2  # how often the rank checks that its agent is still there (one getppid)


class AgentWatch:
    """The Run's notices plus one more source: the rank's agent is gone.

    A daemon thread checks the rank's parent, the agent, every ``_AGENT_POLL_S``; once it is
    gone, :meth:`current` returns a terminate notice whose deadline is the notice grace. Should
    the rank still run when the grace is over (a peer rank died with the agent, so the ranks
    cannot agree any more, or a collective hangs), the thread ends the process with exit 75:
    the newest committed checkpoint stands, and a restart waits no longer than the grace for
    the run directory (:mod:`spotwise.runtime.dirlock`).
    """

    source = "agent"

    def __init__(self, notices: NoticeSource | None, agent: int, grace_s: float) -> None:
        self.notices = notices
        self.agent = agent
        self.grace_s = grace_s
        self._gone: Notice | None = None
        self._stop = threading.Event()
        threading.Thread(target=self._watch, name="spotwise-agent-watch", daemon=True).start()

    def current(self) -> Notice | None:
        own = None if self.notices is None else self.notices.current()
        return most_urgent([own, self._gone])

    def acknowledge(self, notice: Notice) -> None:
        if self.notices is not None and notice.source != self.source:
            self.notices.acknowledge(notice)

    def close(self) -> None:
        """Close the Run's own notices. Once the agent is gone the grace still runs out: the
        Run closes before its ranks leave together, which is where a dead peer hangs them."""
        if self.notices is not None:
            self.notices.close()
        self._stop.set()

    def _watch(self) -> None:
        while os.getppid() == self.agent:
            if self._stop.wait(_AGENT_POLL_S):
                return
        received = time.monotonic()
        self._gone = Notice(
            source=self.source,
            kind=NoticeKind.TERMINATE,
            received_monotonic=received,
            deadline_monotonic=received + self.grace_s,
            action="gone",
            detail={"agent_pid": str(self.agent)},
        )
        _say(
            f"spotwise: torch's agent (pid {self.agent}) is gone; this rank saves with the "
            f"others and exits {EXIT_INTERRUPTED}, within {self.grace_s:g} s"
        )
        time.sleep(self.grace_s)  # a rank that left in time is no longer there to wake up
        _say(
            f"spotwise: the rank did not end within {self.grace_s:g} s of its agent's end (a "
            f"peer rank gone too?); exiting with code {EXIT_INTERRUPTED}, the newest committed "
            "checkpoint stands"
        )
        os._exit(EXIT_INTERRUPTED)


def watch_agent(
    notices: NoticeSource | None, env: Mapping[str, str] = os.environ
) -> NoticeSource | None:
    """``notices`` with :class:`AgentWatch` around them in a rank started by torch elastic's
    agent (its parent, now), else ``notices`` unchanged."""
    if AGENT_ENV not in env:
        return notices
    return AgentWatch(notices, os.getppid(), grace_from_env(env))


def _say(message: str) -> None:
    """One line on stderr straight from a background thread (no stream lock to wait for)."""
    with contextlib.suppress(OSError):
        os.write(2, (message + "\n").encode())
