"""Every unfinished job's control loop, driven from this one process.

The policy code is the controller's own (:class:`~spotwise.control.controller.Controller`):
each driven job holds its lease in the store (``control/store/leases.py``: exactly one replica
drives a job, however many servers share the database; an embedded ``spotwise resume``
refuses it, and ``status`` shows its controller alive) and has its ``tick`` called by a small
pool of worker threads (:mod:`~spotwise.server.workers`), one tick of a job at a time, every
``poll_s`` (a job woken by an event ticks before any periodic tick or adoption queued). Provider
calls therefore happen on those threads, never on the HTTP request path. A job ticks again
only after its previous tick returned, so one slow provider holds up its own job and one
worker, not the others. A job whose machine is running and whose provider tells its end
(:mod:`~spotwise.server.ends`) is ticked when that machine ends, and otherwise only every
``watch_s``, unless it acts on time passing (a budget, a policy): a thousand running jobs then
cost the server next to nothing between their machines' ends, and each end is acted on at once.

At start, and every ``scan_s`` after, the driver adopts each job of the store that has not
ended and whose lease nobody holds (never taken, given back, or expired): a server restarted
after a crash, or another replica after this one died, continues its jobs with the
controller's own recovery (the orphan sweep, ``find`` of a launch whose handle was lost), and
the lease's fence refuses a launch or terminate by a replica that lost the job, so no attempt
is launched twice. Leases are renewed every ``lease_s / 3``; a job whose lease was taken over
is dropped (not ticked again; its machines are the new owner's). A job whose controller raised
(a bug, a store outage) is let go and adopted again after ``retry_s``; the server itself never
stops for one job.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import resource
import threading
import time

from sqlalchemy.exc import SQLAlchemyError

from spotwise.control.controller import Controller
from spotwise.control.ownership import embedded_alive
from spotwise.control.store import Store
from spotwise.control.store.leases import (
    DEFAULT_LEASE_S,
    RENEWALS_PER_LEASE,
    Lease,
    LeaseLost,
    replica_id,
)
from spotwise.errors import ControlError, JobNotFoundError
from spotwise.server.ends import Ends
from spotwise.server.workers import Workers

log = logging.getLogger(__name__)
_MAX_REASON = 300  # characters of an exception shown on the job

DEFAULT_WORKERS = 8
# ticks of jobs woken by an event (a machine's end, a cancel, a resume) go first, and have these
# workers besides, which take no other task: measured with 200 jobs on a loaded machine, the
# periodic ticks of the running jobs kept a shared queue full, and a machine's end waited 17 s
# (median) behind them
WOKEN_WORKERS = 4
MIN_POLL_S = 0.25  # a provider's own poll (sim: 0.05 s) is for one job per process
# a running job whose machine's end wakes it is ticked this often besides, as a safety net (the
# heartbeat's renewals, MAX_BEAT_S, come as often): every 10 s, 1,000 such jobs were 100 ticks a
# second, more than the workers of a 2-core machine could do
WATCH_S = 60.0
SCAN_S = 2.0  # how often the store is searched for jobs nobody drives
RETRY_S = 30.0  # after a controller error, or while another controller holds the job


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
        lease_s: float = DEFAULT_LEASE_S,
    ) -> None:
        self.store = store
        self.min_poll_s = min_poll_s
        self.watch_s = watch_s
        self.lease_s = lease_s
        self.renew_s = lease_s / RENEWALS_PER_LEASE
        self.scan_s = min(scan_s, self.renew_s)  # a lapsed lease is taken within one scan
        self.retry_s = retry_s
        self.replica = replica_id()
        self._workers = Workers(workers, WOKEN_WORKERS, "spotwise-job")
        self._cond = threading.Condition()
        self._driven: dict[str, Controller] = {}
        self._busy: set[str] = set()  # a task for the job is queued or running
        self._due: dict[str, float] = {}  # driven job -> when it ticks next
        self._woken: set[str] = set()  # woken while it ticked
        self._urgent: set[str] = set()  # woken while it waited: its tick is urgent
        self._ended: set[str] = set()  # its machine ended: the next tick, then one more at once
        self._heap: list[tuple[float, int, str]] = []  # (due, seq, job): stale when due differs
        self._seq = itertools.count()
        self._not_before: dict[str, float] = {}  # job -> no adoption before (after an error)
        self._leases: dict[str, Lease] = {}  # job -> this replica's lease of it
        # job -> until when (monotonic) its lease surely holds: its expiry less the fence's
        # margin, from when the last acquire or renewal was sent
        self._sure_until: dict[str, float] = {}
        self._scan_at = 0.0
        self._stopping = False
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="spotwise-driver", daemon=True)
        self._ends = Ends(self._machine_ended)
        self._renewer = threading.Thread(
            target=self._renew_loop, name="spotwise-leases", daemon=True
        )

    # --- lifecycle -------------------------------------------------------------------------
    def start(self) -> None:
        _raise_open_files_limit()  # many jobs' provider connections, files, end descriptors
        self._ends.start()
        self._workers.start()
        self._thread.start()
        self._renewer.start()

    def stop(self) -> None:
        """Stop ticking and let every job go, leases given back (their machines run on;
        another replica, the next server, or ``spotwise resume`` adopts them)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()
        self._workers.shutdown()
        self._ends.stop()
        self._stopped.set()
        self._renewer.join()
        for job_id in list(self._leases):
            self._release(job_id)

    # --- what the API asks -----------------------------------------------------------------
    def wake(self, job_id: str) -> None:
        """Act on ``job_id`` now: adopt it (submitted, resumed) or tick it (cancelled)."""
        with self._cond:
            self._not_before.pop(job_id, None)
            if job_id in self._due:
                self._urgent.add(job_id)
                self._schedule(job_id, time.time())
            elif job_id in self._driven:  # ticking now: it ticks again as soon as it returns
                self._woken.add(job_id)
            else:
                self._scan_at = 0.0
            self._cond.notify_all()

    def _machine_ended(self, job_id: str) -> None:
        """A watched machine ended: the job ticks now (its end is recorded), then again at
        once, not a poll later (the controller relaunches at the tick after the end's)."""
        with self._cond:
            self._ended.add(job_id)
        self.wake(job_id)

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
                            self._workers.submit(self._adopt, job_id)
                while self._heap and self._heap[0][0] <= now:
                    due, _, job_id = heapq.heappop(self._heap)
                    if self._due.get(job_id) == due:
                        del self._due[job_id]
                        self._busy.add(job_id)
                        urgent = job_id in self._urgent
                        self._urgent.discard(job_id)
                        self._workers.submit(self._tick, job_id, urgent=urgent)
                wait = self._scan_at - now
                if self._heap:
                    wait = min(wait, self._heap[0][0] - now)
                self._cond.wait(max(0.0, wait))

    def _unfinished(self) -> list[str]:
        """The jobs no replica drives (this one's own included: those it drives are skipped)."""
        try:
            return self.store.leases.adoptable()
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
        try:
            sent = time.monotonic()
            lease = self.store.leases.acquire(job_id, self.replica, self.lease_s)
            if lease is None:  # another replica was first, or the job has ended
                self._done(job_id)
                return
            with self._cond:
                self._leases[job_id] = lease
                self._sure_until[job_id] = sent + self.lease_s - lease.margin_s
            job = self.store.job(job_id)
            if embedded_alive(job):  # (read after the lease: see Controller.run)
                raise ControlError(f"job {job_id} has an embedded controller on this host")
            controller = Controller(self.store, job_id, fence=lease)
            controller.start(job)
        except LeaseLost as exc:  # taken over while starting (this replica stalled)
            log.info("not adopting job %s: %s", job_id, exc.message)
            self._let_go(job_id, lost=True)
            self._done(job_id)
            return
        except (ControlError, JobNotFoundError) as exc:  # driven by a controller here, or gone
            log.info("not adopting job %s: %s", job_id, exc.message)
            self._let_go(job_id)
            self._done(job_id, retry=True)
            return
        except Exception as exc:  # a bug or an outage in one job never stops the server
            sure = self._sure(job_id)
            self._let_go(job_id)
            self._after_failure(job_id, exc, sure)
            return
        with self._cond:
            self._busy.discard(job_id)
            if self._leases.get(job_id) is lease:
                self._driven[job_id] = controller
                self._schedule(job_id, time.time())
                return
        self._let_go(job_id, lost=True)  # lost while starting (the renewer saw it)

    def _tick(self, job_id: str) -> None:
        with self._cond:
            controller = self._driven[job_id]
        try:
            # a lease not renewed in time (this replica stalled, the store is out) may be
            # another's by now: the job waits for the renewer's verdict instead of acting
            state = controller.tick() if self._sure(job_id) else None
        except LeaseLost as exc:  # the fence refused a launch or terminate: not ours any more
            log.warning("dropping job %s: %s", job_id, exc.message)
            self._release(job_id, lost=True)
            self._done(job_id)
            return
        except Exception as exc:  # (as in _adopt: recorded on the job, adopted again later)
            sure = self._sure(job_id)
            self._release(job_id)
            self._after_failure(job_id, exc, sure)
            return
        if state is not None:
            self._release(job_id)
            self._done(job_id)
            return
        poll = max(self.min_poll_s, controller.provider.features.poll_s)
        handle = controller.running_handle
        if handle is not None and not controller.acts_on_time:
            if self._ends.watch(job_id, controller.provider, handle):
                # (the machine's end wakes it; the heartbeat, if any, still needs its ticks)
                poll = min(self.watch_s, controller.beat_every_s or self.watch_s)
        else:
            self._ends.forget(job_id)
        with self._cond:
            self._busy.discard(job_id)
            held = job_id in self._leases
            if held and not self._stopping:
                woken = job_id in self._woken or job_id in self._ended
                self._woken.discard(job_id)
                self._ended.discard(job_id)
                if woken:
                    self._urgent.add(job_id)
                self._schedule(job_id, time.time() + (0.0 if woken else poll))
        if not held:  # lost while it ticked (the renewer saw it)
            self._release(job_id, lost=True)

    def _release(self, job_id: str, *, lost: bool = False) -> None:
        """Stop driving the job and give its lease back (unless ``lost``: then another replica
        holds it)."""
        with self._cond:
            self._undrive(job_id)
        self._ends.forget(job_id)
        self._let_go(job_id, lost=lost)

    def _undrive(self, job_id: str) -> None:
        """Drop the job from every schedule of this replica (under ``_cond``)."""
        self._driven.pop(job_id, None)
        self._due.pop(job_id, None)
        self._woken.discard(job_id)
        self._ended.discard(job_id)
        self._urgent.discard(job_id)

    def _let_go(self, job_id: str, *, lost: bool = False) -> None:
        """(a job not, or no longer, in ``_driven``)"""
        with self._cond:
            lease = self._leases.pop(job_id, None)
            self._sure_until.pop(job_id, None)
        if lease is None or lost:
            return
        try:
            self.store.leases.release(lease)
        except (SQLAlchemyError, OSError) as exc:  # it lapses by itself within lease_s
            log.error("cannot give back the lease of job %s: %s", job_id, exc)

    # --- leases ----------------------------------------------------------------------------
    def _sure(self, job_id: str) -> bool:
        """Whether the job's lease surely still holds (renewed recently enough)."""
        with self._cond:
            return time.monotonic() < self._sure_until.get(job_id, 0.0)

    def _after_failure(self, job_id: str, exc: Exception, sure: bool) -> None:
        """A controller failed: recorded and retried later (``_failed``), unless its lease had
        lapsed (this replica stalled, or the store was out): then what failed is most likely
        the stall itself (a connection PostgreSQL closed), not the job, which another replica
        or the next scan adopts without a penalty."""
        if sure:
            self._failed(job_id, exc)
            return
        log.warning("let go of job %s, whose lease lapsed: %s: %s", job_id, type(exc).__name__, exc)
        self._done(job_id)

    def _renew_loop(self) -> None:
        """Renew every lease this replica holds, every ``renew_s``; drop the jobs whose lease
        another replica took (after this one could not renew it in time)."""
        while not self._stopped.wait(self.renew_s):
            with self._cond:
                held = dict(self._leases)
            if not held:
                continue
            sent = time.monotonic()
            try:
                renewed = self.store.leases.renew(self.replica, held, self.lease_s)
            except Exception:  # an outage: the jobs wait (_tick) until a renewal succeeds
                log.exception("cannot renew the leases of %d jobs", len(held))
                continue
            with self._cond:
                for job_id in renewed:
                    if self._leases.get(job_id) is held[job_id]:
                        self._sure_until[job_id] = sent + self.lease_s - held[job_id].margin_s
            for job_id, lease in held.items():
                if job_id not in renewed:
                    self._lose(job_id, lease)

    def _lose(self, job_id: str, lease: Lease) -> None:
        """Stop driving a job whose lease was taken over; its machines are left running (they
        are the new owner's). A tick or adoption under way lets it go when it returns."""
        with self._cond:
            if self._leases.get(job_id) is not lease:
                return
            del self._leases[job_id]
            self._sure_until.pop(job_id, None)
            if job_id not in self._busy:
                self._undrive(job_id)
        self._ends.forget(job_id)
        log.warning("lost the lease of job %s to another replica: dropping it", job_id)

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
