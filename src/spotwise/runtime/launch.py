"""torchrun that keeps exit code 75: ``python -m spotwise.runtime.launch [torchrun args]``.

torch's launcher reports any worker that ended with a non-zero code as a failure of its own and
exits 1, so an attempt whose ranks saved and exited 75 (interrupted, state saved) would look like
a crash to the controller. This module runs torch's own launcher (``torch.distributed.run``,
same arguments, same rendezvous and agent) and turns its per-rank failures into one exit code
with :func:`attempt_exit_code`: the rank that ended first is the root cause, and the ranks the
agent stopped afterwards (SIGTERM / SIGKILL from torch's agent) follow that root cause.

A SIGTERM to the launcher (the spot notice; also SLURM's SIGUSR1/SIGUSR2) is passed on to the
workers as that signal, and torch's agent then sees them exit as usual. torchrun's own handler
would instead stop the workers itself and raise, dropping their exit codes, so nobody could tell
whether they saved; the launcher therefore takes SIGTERM out of torchrun's
``--signals-to-handle`` (torch's own switch for it).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from types import FrameType

from spotwise.exitcode import EXIT_INTERRUPTED
from spotwise.proctree import children

EXIT_FAILED = 1  # what torchrun itself exits with when a worker failed
# Notices passed on to the workers: SIGTERM (spot, preemption) and the SIGUSR1/2 that SLURM's
# ``--signal`` sends before the end time (left alone, they would kill the launcher itself)
NOTICE_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


@dataclass(frozen=True)
class RankEnd:
    """How one rank ended, as torch's agent recorded it (``ProcessFailure``)."""

    rank: int
    exitcode: int  # negative: killed by that signal
    timestamp: float  # when the agent saw it end (or the error file's time)


def attempt_exit_code(ends: Mapping[int, RankEnd]) -> int:
    """One exit code for the attempt from its failed ranks (pure).

    The earliest end is the root cause; torch stamps ends in whole seconds, and ranks it killed
    itself (a signal death) are stamped in the same poll as the rank whose exit made it stop
    them, so at equal times an exit code comes before a signal death. Exit 75 there means a
    notice made the ranks save and stop; the others ended in the same way or were stopped by
    the agent after it, so the attempt is interrupted (75). A rank that *also* exited with an
    error code (not 75, not a signal) makes it an error: a crash is never hidden behind a
    preemption. A root cause that is an error or a signal death stays an error.
    """
    if not ends:
        return 0
    first = min(ends.values(), key=lambda e: (e.timestamp, e.exitcode < 0, e.rank))
    if first.exitcode == EXIT_INTERRUPTED and all(
        e.exitcode in (EXIT_INTERRUPTED, 0) or e.exitcode < 0 for e in ends.values()
    ):
        return EXIT_INTERRUPTED
    crashed = [e for e in ends.values() if e.exitcode > 0 and e.exitcode != EXIT_INTERRUPTED]
    if crashed:
        return min(crashed, key=lambda e: (e.timestamp, e.rank)).exitcode
    return EXIT_FAILED


def _forward_notice(signum: int, frame: FrameType | None) -> None:
    """Pass the notice to every worker's process group (torch starts each worker in its own
    session, so the group is the worker and whatever it started). Before any worker exists
    (rendezvous), nothing has trained since the last checkpoint: the attempt ends as
    interrupted (75) at once instead of starting workers on a machine about to go."""
    workers = children(os.getpid())  # the workers torch's agent started
    if not workers:
        raise SystemExit(EXIT_INTERRUPTED)
    for pid in workers:
        try:
            os.killpg(pid, signum)
        except (ProcessLookupError, PermissionError):
            continue


def main(argv: list[str] | None = None) -> int:
    """Parse torchrun's own arguments, run torch's launcher, return the attempt's exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousConnectionError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(sys.argv[1:] if argv is None else argv)
    args.signals_to_handle = ",".join(
        s for s in args.signals_to_handle.split(",") if s.strip() and s.strip() != "SIGTERM"
    )
    for sig in NOTICE_SIGNALS:
        signal.signal(sig, _forward_notice)
    try:
        run(args)  # torchrun's own entry, defaults (--standalone, ports) included
    except ChildFailedError as exc:
        ends = {
            rank: RankEnd(rank, f.exitcode, float(f.timestamp)) for rank, f in exc.failures.items()
        }
        code = attempt_exit_code(ends)
        print(
            f"[spotwise] ranks ended {sorted((r, e.exitcode) for r, e in ends.items())}: "
            f"attempt exit {code}",
            file=sys.stderr,
            flush=True,
        )
        return code
    except RendezvousConnectionError as exc:
        # The rendezvous store lives in node 0's launcher: it is gone with node 0's machine
        # (a spot loss) while this node's ranks still ran. torch's agent stops them on the way
        # out (SIGTERM: the runtime's notice; its peers gone, it keeps the newest committed
        # checkpoint). Node 0's own exit says if it failed, so reading this node's end as
        # interrupted hides no error; reading it as 1 made a lost node an error attempt.
        print(
            f"[spotwise] the rendezvous host (node 0) is gone ({exc}): attempt exit "
            f"{EXIT_INTERRUPTED}",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_INTERRUPTED
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # The agent has stopped its workers and left the rendezvous; what is left is tearing down
    # torch's C++ state, which takes seconds, and a notice's grace is short: leave now.
    os._exit(code)
