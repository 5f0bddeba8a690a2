"""Every unfinished job's control loop, driven from this one process.

The policy code is the controller's own (:class:`~spotwise.control.controller.Controller`):
each driven job holds its ``controller.lock`` (so a ``spotwise resume`` elsewhere refuses, and
``status`` shows its controller alive) and has its ``tick`` called by a small pool of worker
threads, one tick of a job at a time, every ``poll_s``. Provider calls therefore happen on
those threads, never on the HTTP request path. A job ticks again only after its previous tick
returned, so one slow provider holds up its own job and one worker, not the others. A job whose
machine is running and whose provider tells its end (:mod:`~spotwise.server.ends`) is ticked
when that machine ends, and otherwise only every ``watch_s``, unless it acts on time passing
(a budget, a policy): a thousand running jobs then cost the server next to nothing between
their machines' ends, and each end is acted on at once.

At start, and every ``scan_s`` after, the driver adopts each job of the store that has not
ended and that no controller drives: a server restarted after a crash continues its jobs with
the controller's own recovery (the orphan sweep, ``find`` of a launch whose handle was lost), so
no attempt is launched twice. A job whose controller raised (a bug, a store outage) is let go
and adopted again after ``retry_s``; the server itself never stops for one job.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field

from sqlalchemy.exc import SQLAlchemyError

from spotwise.control.controller import Controller, controller_lock
from spotwise.control.store import Store
from spotwise.errors import ControlError, JobNotFoundError
from spotwise.server.ends import Ends

log = logging.getLogger(__name__)
_MAX_REASON = 300  # characters of an exception shown on the job

DEFAULT_WORKERS = 8
MIN_POLL_S = 0.25  # a provider's own poll (sim: 0.05 s) is for one job per process
WATCH_S = 10.0  # a running job whose machine's end wakes it: ticked this often besides
SCAN_S = 2.0  # how often the store is searched for jobs nobody drives
RETRY_S = 30.0  # after a controller error, or while another controller holds the job


@dataclass
class _Driven:
    controller: Controller
    lock: ExitStack = field(default_factory=ExitStack)


class Driver:
    """Drives every unfinished job of ``store`` until :meth:`stop`."""

    def __init__(
        self,
        store: Store,
        *,
        workers: int = DEFAULT_WORKERS,
        min_poll_s: float = MIN_POLL_S,
        watch_s: float = WATCH_S,
        scan_s: float = SCAN_S,
        retry_s: float = RETRY_S,
    ) -> None:
        self.store = store
        self.min_poll_s = min_poll_s
        self.watch_s = watch_s
        self.scan_s = scan_s
        self.retry_s = retry_s
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="spotwise-job")
        self._cond = threading.Condition()
        self._driven: dict[str, _Driven] = {}
        self._busy: set[str] = set()  # a task for the job is queued or running
        self._due: dict[str, float] = {}  # driven job -> when it ticks next
        self._woken: set[str] = set()  # woken while it ticked
        self._heap: list[tuple[float, int, str]] = []  # (due, seq, job): stale when due differs
        self._seq = itertools.count()
        self._not_before: dict[str, float] = {}  # job -> no adoption before (after an error)
        self._scan_at = 0.0
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="spotwise-driver", daemon=True)
        self._ends = Ends(self.wake)

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        _raise_open_files_limit()  # one lock file (and one end descriptor) per driven job
        self._ends.start()
        self._thread.start()

    def stop(self) -> None:
        """Stop ticking and let every job go (their machines run on; the next server, or
        ``spotwise resume``, adopts them)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._ends.stop()
        for driven in self._driven.values():
            driven.lock.close()
        self._driven.clear()

    # --- what the API asks -----------------------------------------------------------------
    def wake(self, job_id: str) -> None:
        """Act on ``job_id`` now: adopt it (submitted, resumed) or tick it (cancelled)."""
        with self._cond:
            self._not_before.pop(job_id, None)
            if job_id in self._due:
                self._schedule(job_id, time.time())
            elif job_id in self._driven:  # ticking now: it ticks again as soon as it returns
                self._woken.add(job_id)
            else:
                self._scan_at = 0.0
            self._cond.notify_all()

    def driving(self) -> int:
        with self._cond:
            return len(self._driven)

    # --- the loop --------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                now = time.time()
                if now >= self._scan_at:
                    self._scan_at = now + self.scan_s
                    self._cond.release()
                    try:
                        unfinished = self._unfinished()
                    finally:
                        self._cond.acquire()
                    for job_id in unfinished:
                        if (
                            job_id not in self._driven
                            and job_id not in self._busy
                            and self._not_before.get(job_id, 0.0) <= now
                        ):
                            self._busy.add(job_id)
                            self._pool.submit(self._adopt, job_id)
                while self._heap and self._heap[0][0] <= now:
                    due, _, job_id = heapq.heappop(self._heap)
                    if self._due.get(job_id) == due:
                        del self._due[job_id]
                        self._busy.add(job_id)
                        self._pool.submit(self._tick, job_id)
                wait = self._scan_at - now
                if self._heap:
                    wait = min(wait, self._heap[0][0] - now)
                self._cond.wait(max(0.0, wait))

    def _unfinished(self) -> list[str]:
        try:
            return self.store.unfinished_ids()
        except Exception:  # a store outage: try again at the next scan
            log.exception("cannot list the jobs")
            return []

    def _schedule(self, job_id: str, due: float) -> None:
        """(holding the lock)"""
        self._due[job_id] = due
        heapq.heappush(self._heap, (due, next(self._seq), job_id))
        self._cond.notify_all()

    # --- one job ---------------------------------------------------------------------------
    def _adopt(self, job_id: str) -> None:
        driven: _Driven | None = None
        try:
            job = self.store.job(job_id)
            if job.state.terminal:
                self._done(job_id)
                return
            driven = _Driven(Controller(self.store, job_id))
            driven.lock.enter_context(controller_lock(job))
            driven.controller.start(job)
        except (ControlError, JobNotFoundError) as exc:  # driven elsewhere, or gone
            log.info("not adopting job %s: %s", job_id, exc.message)
            if driven is not None:
                driven.lock.close()
            self._done(job_id, retry=True)
            return
        except Exception as exc:  # a bug or an outage in one job never stops the server
            if driven is not None:
                driven.lock.close()
            self._failed(job_id, exc)
            return
        with self._cond:
            self._driven[job_id] = driven
            self._busy.discard(job_id)
            self._schedule(job_id, time.time())

    def _tick(self, job_id: str) -> None:
        with self._cond:
            driven = self._driven[job_id]
        try:
            state = driven.controller.tick()
        except Exception as exc:  # (as in _adopt: recorded on the job, adopted again later)
            self._release(job_id)
            self._failed(job_id, exc)
            return
        if state is not None:
            self._release(job_id)
            self._done(job_id)
            return
        controller = driven.controller
        poll = max(self.min_poll_s, controller.provider.features.poll_s)
        handle = controller.running_handle
        if handle is not None and not controller.acts_on_time:
            if self._ends.watch(job_id, controller.provider, handle):
                poll = self.watch_s
        else:
            self._ends.forget(job_id)
        with self._cond:
            self._busy.discard(job_id)
            if not self._stopping:
                woken = job_id in self._woken
                self._woken.discard(job_id)
                self._schedule(job_id, time.time() + (0.0 if woken else poll))

    def _release(self, job_id: str) -> None:
        with self._cond:
            driven = self._driven.pop(job_id)
            self._woken.discard(job_id)
        self._ends.forget(job_id)
        driven.lock.close()

    def _done(self, job_id: str, retry: bool = False) -> None:
        with self._cond:
            self._busy.discard(job_id)
            if retry:
                self._not_before[job_id] = time.time() + self.retry_s

    def _failed(self, job_id: str, exc: Exception) -> None:
        """A controller raised: say what on the job (``spotwise status``, the API) and in the
        server's log with its traceback, and adopt the job again after ``retry_s``."""
        log.error("the controller of job %s failed; adopting it again later", job_id, exc_info=exc)
        what = f"{type(exc).__name__}: {exc}"[:_MAX_REASON]
        try:
            self.store.event(
                job_id,
                "controller",
                f"server: the controller failed ({what}); adopting the job again in "
                f"{self.retry_s:g}s (traceback in the server's log)",
            )
        except (SQLAlchemyError, OSError) as outage:  # the store is what failed: the log says it
            log.error("cannot record the failure of job %s: %s", job_id, outage)
        self._done(job_id, retry=True)


def _raise_open_files_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard != resource.RLIM_INFINITY:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
