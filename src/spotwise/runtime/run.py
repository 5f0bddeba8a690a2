"""Run: the training loop's companion. It resumes, decides when to save, saves in the background,
reacts to interruption notices and exits 75 when the machine is about to go away.

    run = spotwise.Run("runs/digits", state={"model": model, "opt": opt, "sched": sched},
                       loader=loader, steps=3000)
    for x, y in run:                 # one batch per optimizer step, across epochs
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()

What is saved is one mapping of stateful objects (``state={"model": m, "opt": o}``), plus the
loader's position (:mod:`~spotwise.runtime.cursor`), the RNGs and ``run.extras``. When and
what to keep is one :class:`~spotwise.runtime.config.CheckpointConfig` (``checkpoint=``); the
flat keywords of 0.1 (``model=``, ``every=``...) still work and warn
(:mod:`~spotwise.runtime.keywords`). How a save is written (alone, with an object store behind
the local directory, or as one rank of a torchrun job) is chosen once, here, and hidden behind
one :class:`~spotwise.runtime.saver.base.Saver`.

With ``accumulate=K`` the loop gets K micro-batches per optimizer step; ``run.sync_gradients``
is true in the body of the last one, where the optimizer steps:

    for x, y in run:
        (F.cross_entropy(model(x), y) / run.accumulate).backward()
        if run.sync_gradients:
            opt.step(); opt.zero_grad()

The code after the yield of an optimizer step's last micro-batch is the step boundary: the step
counter advances, a failed background save is raised, notices are checked and, when due, a
snapshot is taken. Nothing is saved inside a window (its gradients are not part of the state),
so a kill there resumes from the window's start.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from spotwise.checkpoint.read import CheckpointInfo
from spotwise.checkpoint.write import clean_temporaries
from spotwise.errors import ConfigError, DataLoaderError, SaveError
from spotwise.exitcode import EXIT_INTERRUPTED
from spotwise.notices.base import Notice, NoticeSource
from spotwise.notices.watcher import open_notices
from spotwise.runtime import dirlock, distributed, keywords, rundir
from spotwise.runtime.commit import LoadedCheckpoint
from spotwise.runtime.config import CheckpointConfig
from spotwise.runtime.cursor import LoaderCursor
from spotwise.runtime.distributed import agent
from spotwise.runtime.interval import notice_exit_due, save_due
from spotwise.runtime.restore import apply_checkpoint, newest_fitting
from spotwise.runtime.saver import EARLY_SAVE, EXIT, NOTHING, Mirror, open_saver, smooth
from spotwise.runtime.state import STATE_VERSION, StateEncoder, capture_rng
from spotwise.telemetry.events import EVENTS_FILE, EventLog
from spotwise.telemetry.runmetrics import RunTelemetry

log = logging.getLogger(__name__)


class Run:
    """Resumable training: see the module docstring. Pass ``steps`` to iterate."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        state: Mapping[str, Any] | None = None,
        loader: Any = None,
        steps: int | None = None,
        accumulate: int = 1,
        seed: int | None = None,
        checkpoint: CheckpointConfig | None = None,
        notices: NoticeSource | str | None = "auto",
        metrics_port: int | None = None,  # or SPOTWISE_METRICS_PORT: /metrics on 127.0.0.1
        gpu_sample_s: float | None = None,  # or SPOTWISE_GPU_SAMPLE_S; default 5, 0 is off
        **deprecated: Any,  # model=, every=, mirror=, local_dir=...: see runtime.keywords
    ) -> None:
        ranks = distributed.current()  # under torchrun: models and optimizers go through DCP
        self.state, config = keywords.settle(state, checkpoint, deprecated, stacklevel=2)
        if ranks is not None and config.mirror is not None:
            raise ConfigError(
                "mirror= is not supported under torch.distributed",
                hint="pass an s3://bucket/prefix run_dir: each rank uploads its own files",
            )
        self.run_dir, remote_uri = rundir.locate(run_dir, config.local_dir, ranks)
        self.config = config.with_environment(os.environ)
        self.total_steps, self.accumulate = _checked_steps(steps), _checked_accumulate(accumulate)
        coordinator = ranks is None or ranks.is_coordinator  # the others' events repeat its
        self.events = EventLog(self.run_dir / EVENTS_FILE if coordinator else os.devnull)
        self._saver = open_saver(
            self.run_dir,
            remote_uri,
            ranks=ranks,
            config=self.config,
            events=self.events,
            state=self.state,
        )
        self.step = 0
        self.extras: dict[str, Any] = {}  # user state saved with every checkpoint (JSON/tensors)
        self.metrics: dict[str, float] = {}  # attached to the next checkpoint's manifest
        self.resumed_from: CheckpointInfo | None = None
        seed = self._saver.common_seed(seed if seed is not None else _draw_seed())
        self._cursor = LoaderCursor(loader, seed)
        self._micro = 0  # micro-batches of the current accumulation window already yielded
        self._in_body = False  # between a yield and the code after it
        self.step_s: float | None = None  # smoothed time from one step boundary to the next
        self._last_boundary: float | None = None
        self._handled: set[tuple[Any, ...]] = set()  # the notices acted on once
        self._closed = False
        self._notices: NoticeSource | None = None
        self._start(ranks, notices, metrics_port, gpu_sample_s)

    def _start(
        self,
        ranks: distributed.Ranks | None,
        notices: NoticeSource | str | None,
        metrics_port: int | None,
        gpu_sample_s: float | None,
    ) -> None:
        """Lock the run directory, resume from its newest checkpoint and start listening for
        notices; on any failure the notices and the lock are released before it is raised."""
        self._lock_fd = rundir.lock(self.run_dir, ranks, owner=self._saver.owns_dir)
        try:
            restore_s = self._resume()
            self._notices = open_notices(notices)
            if ranks is not None:  # a rank whose torchrun agent is gone: one more notice
                self._notices = agent.watch_agent(self._notices)
            self.telemetry = RunTelemetry(
                self, metrics_port=metrics_port, gpu_sample_s=gpu_sample_s
            )
        except BaseException:
            if self._notices is not None:
                self._notices.close()
            self._release_lock()
            raise
        self._saver.stats.last_step = self.step
        self.events.emit(
            "start",
            step=self.step,
            resumed=self.resumed_from is not None,
            pid=os.getpid(),
            restore_s=round(restore_s, 6),
        )

    # --- public -------------------------------------------------------------------------------
    @property
    def done(self) -> bool:
        return self.total_steps is not None and self.step >= self.total_steps

    @property
    def sync_gradients(self) -> bool:
        """True in the loop body of an optimizer step's last micro-batch (always, without
        accumulation): step the optimizer there."""
        return self._micro == self.accumulate - 1

    @property
    def epoch(self) -> int:
        return self._cursor.epoch

    @property
    def batch_in_epoch(self) -> int:
        return self._cursor.batch_in_epoch

    @property
    def seed(self) -> int:
        """The data order's seed (the same on every rank)."""
        return self._cursor.seed

    @property
    def loader(self) -> Any:
        """The loader the batches come from (a plain one made resumable), or None."""
        return self._cursor.loader

    @property
    def save_cost_s(self) -> float | None:
        """Smoothed blocking cost of a save."""
        return self._saver.stats.save_cost_s

    @property
    def write_s(self) -> float | None:
        """Smoothed duration of a background write."""
        return self._saver.stats.write_s

    def __iter__(self) -> Iterator[Any]:
        """Yield ``accumulate`` batches per optimizer step (or the step number without a
        loader) until ``steps``; then save the final checkpoint and release the run
        directory."""
        if self.total_steps is None:
            raise ConfigError("Run needs steps=N (total optimizer steps) to be iterated")
        clean_exit = False
        try:
            while self.step < self.total_steps:
                item = self._next_item()
                self._in_body = True
                yield item
                self._in_body = False
                if self.loader is not None:
                    self._cursor.batch_in_epoch += 1
                self._micro += 1
                if self._micro == self.accumulate:
                    self._micro = 0
                    self._step_boundary()
            self._wait_writer()
            if self._saver.stats.committed_step != self.step:
                self._save(block=True, reason="final")
            self.events.emit("finished", step=self.step)
            clean_exit = True
        finally:
            self._cursor.stop()
            if clean_exit:
                self.close()
            else:
                self._wait_writer(quiet=True)

    def log(self, **metrics: float) -> None:
        """Record metrics (loss, accuracy...) for the next checkpoint's manifest; retention's
        ``keep_best`` ranks by them."""
        self.metrics.update({k: float(v) for k, v in metrics.items()})
        self.telemetry.logged(self.step, self.metrics)

    def save(self, *, block: bool = True) -> None:
        """Save now (blocking by default); the periodic schedule continues from here."""
        if self._in_body and not self.sync_gradients:
            raise ConfigError(
                "run.save() inside an accumulation window: the window's gradients are not saved",
                hint="call it where run.sync_gradients is true, after the optimizer step",
            )
        self._wait_writer()
        if self._saver.stats.committed_step != self.step:
            self._save(block=block, reason="manual")

    def close(self) -> None:
        """Wait for a background save (raising its error) and for the mirror, stop notice
        watching and release the run directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._saver.close()
        finally:
            self._cursor.close()
            if self._notices is not None:
                self._notices.close()
            self.telemetry.close()
            self._release_lock()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            with contextlib.suppress(SaveError):
                self.close()

    # --- the loop -------------------------------------------------------------------------------
    def _next_item(self) -> Any:
        if self.loader is None:
            return self.step
        while True:
            try:
                return self._cursor.next()
            except DataLoaderError as failure:
                # a pending notice first: a terminate notice saves and exits 75 here
                self._handle_pending_notice()
                self._cursor.rerun_after(failure)

    def _handle_pending_notice(self) -> None:
        """Act on a notice that arrived while the loader failed (only at a step boundary:
        inside an accumulation window there is nothing consistent to save)."""
        # under torch.distributed a notice is acted on at a boundary, by every rank together
        if self._notices is not None and self._micro == 0 and self._saver.solo:
            notice = self._notices.current()
            if notice is not None:
                self._act(self._notice_action(notice), notice)

    def _step_boundary(self) -> None:
        now = time.monotonic()
        if self._last_boundary is not None:
            self.step_s = smooth(self.step_s, now - self._last_boundary)
        self._last_boundary = now
        self.step += 1
        notice = None if self._notices is None else self._notices.current()
        stats = self._saver.stats
        due = save_due(
            self.config.schedule,
            step=self.step,
            steps_since_save=self.step - stats.last_step,
            seconds_since_save=time.monotonic() - stats.last_time,
            save_cost_s=stats.save_cost_s,
            write_s=stats.write_s,
            mtbi_s=self.config.mtbi,
        )
        action, due = self._saver.poll(lambda: self._notice_action(notice), due)
        self._act(action, notice)
        # the final save follows right after the last step; a notice may have just saved
        if due and not self.done and stats.last_step != self.step:
            self._save(block=not self.config.async_save, reason="interval")

    def _act(self, action: int, notice: Notice | None) -> None:
        """Carry out a notice's ``action`` (``notice`` is None on a rank that acts because
        another rank had the notice)."""
        if action == EXIT:
            self._emergency_exit(notice)
        if action == EARLY_SAVE:
            self._early_save(notice)

    def _notice_action(self, notice: Notice | None) -> int:
        """What ``notice`` asks of this step: exit now, one early save (an advisory notice, or
        a terminate notice with time to spare, each acted on once), or nothing."""
        if notice is None:
            return NOTHING
        if notice.is_terminate and self._must_exit(notice):
            return EXIT
        key = (notice.source, notice.kind, notice.received_monotonic, notice.action)
        if key in self._handled:
            return NOTHING
        self._handled.add(key)
        return EARLY_SAVE

    def _early_save(self, notice: Notice | None) -> None:
        """One early save, and training goes on."""
        if notice is not None:
            self.events.emit(
                "notice", step=self.step, source=notice.source, notice=notice.kind.value
            )
        self._wait_writer()
        if self._saver.stats.committed_step != self.step:
            self._save(block=False, reason="advisory")

    def _must_exit(self, notice: Notice) -> bool:
        remaining = (
            None
            if notice.deadline_monotonic is None
            else notice.deadline_monotonic - time.monotonic()
        )
        save_cost_s, write_s = self.save_cost_s, self.write_s
        return notice_exit_due(
            remaining,
            step_s=self.step_s,
            save_s=None if save_cost_s is None else save_cost_s + (write_s or 0.0),
            margin_s=self.config.notice_margin,
            steps_per_check=self._saver.steps_per_check,
        )

    def _emergency_exit(self, notice: Notice | None) -> None:
        """Save synchronously, acknowledge, and leave with exit code 75."""
        try:
            self._wait_writer()
        except SaveError as exc:
            log.warning("a background save failed (%s); saving synchronously now", exc)
        if self._saver.stats.committed_step != self.step:
            self._save(block=True, reason="notice")
        self._saver.flush()
        assert self._notices is not None
        if notice is not None:
            self._notices.acknowledge(notice)
        source = "another rank's" if notice is None else notice.source
        self.events.emit(
            "interrupted",
            step=self.step,
            source=source,
            action=None if notice is None else notice.action,
            exit_code=EXIT_INTERRUPTED,
        )
        what = "exit" if notice is None else notice.action or notice.kind.value
        print(
            f"spotwise: {source} notice ({what}): saved "
            f"step {self.step} in {self.run_dir}; exiting with code {EXIT_INTERRUPTED} "
            "(restart to resume)",
            file=sys.stderr,
            flush=True,
        )
        self.close()
        self._saver.leave()
        raise SystemExit(EXIT_INTERRUPTED)

    # --- saving and restoring -------------------------------------------------------------------
    def _save(self, *, block: bool, reason: str) -> None:
        self._wait_writer()
        self._saver.save(
            self.step, self.metrics, self._capture, self._capture_rank, block=block, reason=reason
        )

    def _wait_writer(self, quiet: bool = False) -> None:
        """Finish the background save, if any (see :meth:`Saver.wait`)."""
        self._saver.wait(quiet)

    def _capture(self, per_rank: bool) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The live tensors and a detached JSON-able document of everything else (serialized
        on the saving thread, outside the stall). Under torch.distributed the models and
        optimizers are left to DCP, and the RNGs and extras (``per_rank=False``) to each
        rank's own files."""
        encoder = StateEncoder()
        cursor = self._cursor
        sampler = cursor.sampler_state()
        doc = {
            "spotwise": {
                "version": STATE_VERSION,
                "step": self.step,
                "epoch": cursor.epoch,
                "batch_in_epoch": cursor.batch_in_epoch,
                "seed": cursor.seed,
                "accumulate": self.accumulate,
            },
            "state": {
                name: encoder.encode(obj.state_dict(), f"state/{name}")
                for name, obj in self.state.items()
                if name not in self._saver.sharded
            },
            "sampler": encoder.encode(sampler, "sampler"),
            "loader": encoder.encode(cursor.loader_state(), "loader"),
            "extras": encoder.encode(self.extras, "extras") if per_rank else None,
            "rng": encoder.encode(capture_rng(), "rng") if per_rank else None,
        }
        return encoder.tensors, doc

    def _capture_rank(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This rank's own part of a distributed checkpoint: its RNGs and extras."""
        encoder = StateEncoder()
        doc = {
            "extras": encoder.encode(self.extras, "extras"),
            "rng": encoder.encode(capture_rng(), "rng"),
        }
        return encoder.tensors, doc

    def _resume(self) -> float:
        """Restore the newest checkpoint that fits; returns how long it took (the goodput
        ledger's "restore" time)."""
        started = time.monotonic()
        self._saver.prepare()
        if self._saver.owns_dir:  # each cleans its own directory
            clean_temporaries(self.run_dir)
        newest_fitting(self._saver.checkpoints(), self.run_dir, self._restore, stacklevel=4)
        return time.monotonic() - started

    def _restore(self, loaded: LoadedCheckpoint) -> None:
        counters, doc = apply_checkpoint(
            loaded, self.state, accumulate=self.accumulate, cursor=self._cursor, saver=self._saver
        )
        self.step = counters["step"]
        self._cursor.move_to(counters["epoch"], counters["batch_in_epoch"], counters["seed"])
        self.extras = dict(doc["extras"] or {})
        self.metrics = dict(loaded.info.metrics)
        self._saver.stats.committed_step = self.step
        self.resumed_from = loaded.info
        log.info("resumed from %s (step %d)", loaded.info.path, self.step)
        self.events.emit("resume", step=self.step, checkpoint=loaded.info.path.name)

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            dirlock.release(self._lock_fd)
            self._lock_fd = None


def _checked_steps(steps: int | None) -> int | None:
    if steps is not None and (isinstance(steps, bool) or steps < 0):
        raise ConfigError(f"steps must be a non-negative number of steps, got {steps!r}")
    return steps


def _checked_accumulate(accumulate: int) -> int:
    if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
        raise ConfigError(
            f"accumulate must be a whole number of micro-batches per step, got {accumulate!r}"
        )
    return accumulate


def _draw_seed() -> int:
    """A seed drawn from torch's global RNG, so ``torch.manual_seed`` controls the data order."""
    return int(torch.randint(0, 2**62, (1,)).item())


__all__ = ["EXIT_INTERRUPTED", "Mirror", "Run"]
