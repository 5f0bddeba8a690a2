"""Run: the training loop's companion. It resumes, decides when to save, saves in the background,
reacts to interruption notices and exits 75 when the machine is about to go away.

    run = spotwise.Run("runs/digits", model=model, optimizer=opt, scheduler=sched,
                       loader=loader, steps=3000, every="auto")
    for x, y in run:                 # one batch per optimizer step, across epochs
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step(); sched.step()

What is saved is one mapping of stateful objects (``state={"model": m, "opt": o}``; the
``model=``/``optimizer=``/``scheduler=``/``scaler=`` keywords are spellings that fill it), plus
the loader's position, the RNGs and ``run.extras``. Checkpoint settings are one
:class:`~spotwise.runtime.config.CheckpointConfig` (or its fields as keywords).

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
import json
import logging
import os
import signal
import sys
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch
from torch.utils.data import DataLoader

from spotwise.checkpoint.read import CheckpointInfo
from spotwise.checkpoint.remote import RemoteCheckpoint, is_remote, open_remote
from spotwise.checkpoint.retention import retain
from spotwise.checkpoint.write import clean_temporaries
from spotwise.errors import (
    CheckpointError,
    ConfigError,
    CorruptCheckpointError,
    DataLoaderError,
    SaveError,
    StateMismatchError,
)
from spotwise.exitcode import EXIT_INTERRUPTED
from spotwise.notices.base import Notice, NoticeSource
from spotwise.notices.heartbeat import HEARTBEAT_KEY
from spotwise.notices.watcher import open_notices
from spotwise.runtime import agent, dirlock, distributed
from spotwise.runtime.commit import LoadedCheckpoint, loadable_checkpoints, write_checkpoint
from spotwise.runtime.config import CheckpointConfig, checkpoint_config
from spotwise.runtime.format import TensorBlob, pack_tensors
from spotwise.runtime.interval import notice_exit_due, save_due
from spotwise.runtime.sampler import (
    ResumableBatchSampler,
    derive_seed,
    has_state,
    make_resumable,
    stateful_source,
)
from spotwise.runtime.snapshot import SnapshotBuffer
from spotwise.runtime.state import (
    RUN_KIND,
    STATE_VERSION,
    StateEncoder,
    capture_rng,
    check_module_state,
    check_run_state,
    restore_rng,
)
from spotwise.runtime.tiered import TieredMirror, retain_remote, staging_dir
from spotwise.runtime.workers import LoaderWorkers
from spotwise.storage.base import Storage
from spotwise.telemetry.events import EVENTS_FILE, EventLog
from spotwise.telemetry.runmetrics import RunTelemetry

if TYPE_CHECKING:
    from spotwise.runtime.sharded import PendingSave, SavePlans, StagingBuffers

log = logging.getLogger(__name__)

# a loader whose workers die this often at one position has a problem a restart does not fix
MAX_LOADER_RESTARTS = 2
# (the controller's heartbeat may be there first: notices.heartbeat)
_OURS = (dirlock.LOCK_FILE, EVENTS_FILE, HEARTBEAT_KEY, "step-", ".tmp-step-", ".trash-step-")


@runtime_checkable
class Mirror(Protocol):
    """A second tier behind the local run directory (for example an object store).

    ``restore`` runs once at start, before the local directory is searched, and may place the
    newest remote checkpoint there; ``committed`` runs on the saving thread after every local
    commit and retention pass; ``flush`` blocks until everything committed is safe remotely
    (called before the final exit and before exiting on a notice).
    """

    def restore(self, run_dir: Path) -> None: ...

    def committed(self, checkpoint: CheckpointInfo, deleted: Sequence[CheckpointInfo]) -> None: ...

    def flush(self) -> None: ...


class Run:
    """Resumable training: see the module docstring. Pass ``steps`` to iterate."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        state: Mapping[str, Any] | None = None,
        model: Any = None,
        optimizer: Any = None,
        scheduler: Any = None,
        scaler: Any = None,
        loader: Any = None,
        steps: int | None = None,
        accumulate: int = 1,
        seed: int | None = None,
        checkpoint: CheckpointConfig | None = None,
        every: int | str | None = "auto",
        keep_last: int = 3,
        keep_best: int = 0,
        best_metric: str | None = None,
        best_mode: str = "min",
        keep_every: int | None = None,
        async_save: bool = True,
        mtbi_s: float | None = None,
        notice_margin_s: float | None = None,
        notices: NoticeSource | str | None = "auto",
        mirror: Mirror | None = None,
        local_dir: str | os.PathLike[str] | None = None,  # staging dir for an s3:// run_dir
        metrics_port: int | None = None,  # or SPOTWISE_METRICS_PORT: /metrics on 127.0.0.1
        gpu_sample_s: float | None = None,  # or SPOTWISE_GPU_SAMPLE_S; default 5, 0 is off
    ) -> None:
        remote_uri = os.fspath(run_dir) if is_remote(run_dir) else None
        # under torch.distributed (torchrun): models and optimizers are saved through DCP
        self._ranks = distributed.current()
        if self._ranks is not None and mirror is not None:
            raise ConfigError(
                "mirror= is not supported under torch.distributed",
                hint="pass an s3://bucket/prefix run_dir: each rank uploads its own files",
            )
        local = staging_dir(remote_uri, local_dir) if remote_uri else run_dir
        if remote_uri is not None and self._ranks is not None:  # no rank shares another's
            local = Path(local) / f"rank-{self._ranks.rank:05d}"
        self.run_dir = _local_run_dir(local)
        self.state = _stateful(
            state, model=model, optimizer=optimizer, scheduler=scheduler, scaler=scaler
        )
        self._agreement = (
            None
            if self._ranks is None
            else distributed.Agreement(self._ranks, distributed.round_trip_s(self._ranks))
        )
        self._sharded = {} if self._ranks is None else _sharded().sharded_objects(self.state)
        if steps is not None and (isinstance(steps, bool) or steps < 0):
            raise ConfigError(f"steps must be a non-negative number of steps, got {steps!r}")
        if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
            raise ConfigError(
                f"accumulate must be a whole number of micro-batches per step, got {accumulate!r}"
            )
        self.total_steps = steps
        self.accumulate = accumulate
        self.config = checkpoint_config(
            checkpoint,
            {
                "every": every,
                "keep_last": keep_last,
                "keep_best": keep_best,
                "best_metric": best_metric,
                "best_mode": best_mode,
                "keep_every": keep_every,
                "async_save": async_save,
                "mtbi_s": mtbi_s,
                "notice_margin_s": notice_margin_s,
            },
        ).with_environment(os.environ)
        # distributed without a shared file system: the object store is where ranks commit
        self._remote: Storage | None = None
        self._remote_scans: dict[str, RemoteCheckpoint] = {}  # retention's cache of manifests
        if self._ranks is not None and remote_uri is not None:
            self._remote = open_remote(remote_uri)
        elif remote_uri is not None:  # two tiers: commit locally, upload in the background
            if mirror is not None:
                raise ConfigError("pass either a remote run_dir or mirror=, not both")
            mirror = TieredMirror.from_uri(remote_uri, retention=self.config.retention)
        self.mirror = mirror

        self.step = 0
        self.epoch = 0
        self.batch_in_epoch = 0
        self.extras: dict[str, Any] = {}  # user state saved with every checkpoint (JSON/tensors)
        self.metrics: dict[str, float] = {}  # attached to the next checkpoint's manifest
        self.resumed_from: CheckpointInfo | None = None
        self.seed = seed if seed is not None else _draw_seed()
        if self._ranks is not None:  # one data order for the whole job: rank 0's
            self.seed = distributed.broadcast_ints(self._ranks, [self.seed])[0]

        self.loader: Any = None
        self._batches: ResumableBatchSampler | None = None  # our sampler, for plain loaders
        self._position: Any = None  # what keeps a stateful loader's position
        self._workers: LoaderWorkers | None = None
        self._micro = 0  # micro-batches of the current accumulation window already yielded
        self._in_body = False  # between a yield and the code after it
        if loader is not None:
            group = torch.distributed.is_available() and torch.distributed.is_initialized()
            rank = torch.distributed.get_rank() if group else 0
            world = torch.distributed.get_world_size() if group else 1
            self._position = stateful_source(loader, world=world)
            if self._position is None:
                self.loader, self._batches = make_resumable(
                    loader, self.seed, rank=rank, world=world
                )
                if len(self._batches) == 0:
                    raise ConfigError("the data loader yields no batches (empty dataset?)")
            else:
                self.loader = loader
            if isinstance(self.loader, DataLoader):
                self._workers = LoaderWorkers(self.loader)
        self._iter: Iterator[Any] | None = None
        self._empty_epochs = 0
        self._loader_failures: tuple[tuple[int, int], int] = ((-1, -1), 0)  # position, count

        self._snapshot = SnapshotBuffer()
        self._writer: Future[None] | None = None  # a single-process background save
        self._pending: PendingSave | None = None  # a distributed background save
        self._staging: StagingBuffers | None = None  # its reused buffers
        self._plans: SavePlans | None = None if self._ranks is None else _sharded().SavePlans()
        self._save_pool = ThreadPoolExecutor(1, thread_name_prefix="spotwise-save")  # one, reused
        self._committed_step: int | None = None
        self._last_save_step = 0
        self._last_save_time = time.monotonic()
        self.save_cost_s: float | None = None  # smoothed blocking cost of a save
        self.write_s: float | None = None  # smoothed duration of a background write
        self.step_s: float | None = None  # smoothed time from one step boundary to the next
        self._last_boundary: float | None = None
        self._handled: set[tuple[Any, ...]] = set()
        self._closed = False
        self._notices: NoticeSource | None = None

        self._lock_fd: int | None = self._acquire_lock()
        coordinator = self._ranks is None or self._ranks.is_coordinator
        # the run's events are rank 0's; the other ranks' would repeat them
        self.events = EventLog(self.run_dir / EVENTS_FILE if coordinator else os.devnull)
        restore_started = time.monotonic()  # the goodput ledger's "restore" time
        try:
            if mirror is not None:
                mirror.restore(self.run_dir)
            if coordinator or self._remote is not None:  # each cleans its own directory
                clean_temporaries(self.run_dir)
            self._resume()
            restore_s = time.monotonic() - restore_started
            self._notices = open_notices(notices)
            if self._ranks is not None:  # a rank whose torchrun agent is gone: one more notice
                self._notices = agent.watch_agent(self._notices)
            self.telemetry = RunTelemetry(
                self, metrics_port=metrics_port, gpu_sample_s=gpu_sample_s
            )
        except BaseException:
            if self._notices is not None:
                self._notices.close()
            self._release_lock()
            raise
        self._last_save_step = self.step
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
                    self.batch_in_epoch += 1
                self._micro += 1
                if self._micro == self.accumulate:
                    self._micro = 0
                    self._step_boundary()
            self._wait_writer()
            if self._committed_step != self.step:
                self._save(block=True, reason="final")
            self.events.emit("finished", step=self.step)
            clean_exit = True
        finally:
            self._stop_loader()
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
        if self._committed_step != self.step:
            self._save(block=block, reason="manual")

    def close(self) -> None:
        """Wait for a background save (raising its error) and for the mirror, stop notice
        watching and release the run directory. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._agreement is not None:
                self._agreement.drain()
                # every rank is done with the Run's gloo group before any of them goes on: a
                # destroy_process_group() right after close() on one rank while another still
                # had the group's pairs open aborted it ("terminate called without an active
                # exception")
                distributed.all_agree(self._agreement.ranks, True)
            self._wait_writer()
            if self.mirror is not None:
                self.mirror.flush()
        finally:
            self._save_pool.shutdown()
            if self._workers is not None:
                self._workers.close()
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
            if self._iter is None:
                self._iter = self._start_loader()
            try:
                workers = self._workers
                item = next(self._iter) if workers is None else workers.next(self._iter)
                self._empty_epochs = 0
                return item
            except StopIteration:
                self._iter = None
                self.epoch += 1
                self.batch_in_epoch = 0
                self._empty_epochs += 1
                if self._empty_epochs > 2:  # one may be the end of a resumed epoch
                    raise ConfigError(
                        "the data loader yields no batches", hint="check the dataset"
                    ) from None
            except DataLoaderError as failure:
                self._iter = None
                if self._position is not None:  # its position is the loader's own: no rerun
                    self._handle_pending_notice()
                    raise
                self._after_loader_failure(failure)

    def _start_loader(self) -> Iterator[Any]:
        """A new iterator at the run's position; a stateful loader's parts that have
        ``set_epoch`` are told the epoch. A stateful loader draws its shuffling and
        worker seeds from the global torch RNG when it has no generator of its own: it does so
        here from a seed of (run seed, epoch), then the global RNG is put back, so dropout
        after a resume sees the numbers it would have seen."""
        if self._batches is not None:
            self._batches.set_position(self.epoch, self.batch_in_epoch)
            assert self.loader.generator is not None
            self.loader.generator.manual_seed(derive_seed(self.seed, self.epoch, "loader"))
            assert self._workers is not None
            return self._workers.start()
        # the epoch convention of DistributedSampler and Hugging Face datasets: a resumed
        # stream applies its loaded position only in the epoch it was saved in
        parts: list[Any] = [
            self._position,
            getattr(self.loader, "dataset", None),
            getattr(self.loader, "sampler", None),
        ]
        setters = {id(p): p.set_epoch for p in parts if callable(getattr(p, "set_epoch", None))}
        for set_epoch in setters.values():
            set_epoch(self.epoch)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(self.seed, self.epoch, "loader"))
            return self._workers.start() if self._workers is not None else iter(self.loader)

    def _stop_loader(self) -> None:
        """End the iterator's workers now. A stateful loader keeps a reference to its iterator
        (for ``state_dict``), so dropping ours would leave them waiting for work, and the
        interpreter's exit waiting for them."""
        iterator, self._iter = self._iter, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def _handle_pending_notice(self) -> None:
        """Act on a notice that arrived while the loader failed (only at a step boundary:
        inside an accumulation window there is nothing consistent to save)."""
        # under torch.distributed a notice is acted on at a boundary, by every rank together
        if self._notices is not None and self._micro == 0 and self._ranks is None:
            notice = self._notices.current()
            if notice is not None:
                self._on_notice(notice)

    def _after_loader_failure(self, failure: DataLoaderError) -> None:
        """A worker died between two steps (a signal it could not ignore, the OOM killer). A
        pending notice is handled first: a terminate notice saves and exits 75 here. Otherwise
        the loader starts again at the same position, which yields the same batches (each batch
        carries its own seed); a worker that keeps dying at one position is an error."""
        self._handle_pending_notice()
        position = (self.epoch, self.batch_in_epoch)
        seen, count = self._loader_failures
        count = count + 1 if seen == position else 1
        self._loader_failures = (position, count)
        if count > MAX_LOADER_RESTARTS:
            raise failure
        log.warning(
            "spotwise: %s; restarting the data loader at epoch %d, batch %d",
            failure.message,
            *position,
        )

    def _step_boundary(self) -> None:
        now = time.monotonic()
        if self._last_boundary is not None:
            self.step_s = _smooth(self.step_s, now - self._last_boundary)
        self._last_boundary = now
        self.step += 1
        self._raise_writer_error()
        notice = None if self._notices is None else self._notices.current()
        if self._ranks is None and notice is not None:
            self._on_notice(notice)
        due = save_due(
            self.config.schedule,
            step=self.step,
            steps_since_save=self.step - self._last_save_step,
            seconds_since_save=time.monotonic() - self._last_save_time,
            save_cost_s=self.save_cost_s,
            write_s=self.write_s,
            mtbi_s=self.config.mtbi,
        )
        if self._agreement is not None:  # every rank acts as the most urgent of them, together
            schedule = self.config.schedule
            timed = schedule.seconds is not None or schedule.auto  # steps are the same everywhere
            pending = self._pending
            agreed = self._agreement.boundary(
                lambda: [
                    self._notice_action(notice),
                    int(due and timed),
                    0 if pending is None else pending.busy(),
                ]
            )
            if timed:  # only as agreed: between agreements a timed save waits for the next one
                due = agreed is not None and bool(agreed[1])
            if agreed is not None:
                self._act_on_agreement(agreed, pending, notice)
        # the final save follows right after the last step; a notice may have just saved
        if due and not self.done and self._last_save_step != self.step:
            self._save(block=not self.config.async_save, reason="interval")

    def _act_on_agreement(
        self, agreed: list[int], pending: PendingSave | None, notice: Notice | None
    ) -> None:
        action, _, writing = agreed
        if pending is not None:  # a failed save is not retried: dropped before it raises
            self._pending = None
            if pending.agreed(writing):  # committed, on every rank at this boundary
                self._settled(pending)
            else:
                self._pending = pending
        if action == _EXIT:
            self._emergency_exit(notice)
        if action == _EARLY_SAVE:
            self._early_save(notice)

    def _on_notice(self, notice: Notice) -> None:
        action = self._notice_action(notice)
        if action == _EXIT:
            self._emergency_exit(notice)
        if action == _EARLY_SAVE:
            self._early_save(notice)

    def _notice_action(self, notice: Notice | None) -> int:
        """What ``notice`` asks of this step: exit now, one early save (an advisory notice, or
        a terminate notice with time to spare, each acted on once), or nothing."""
        if notice is None:
            return _NOTHING
        if notice.is_terminate and self._must_exit(notice):
            return _EXIT
        key = (notice.source, notice.kind, notice.received_monotonic, notice.action)
        if key in self._handled:
            return _NOTHING
        self._handled.add(key)
        return _EARLY_SAVE

    def _early_save(self, notice: Notice | None) -> None:
        """One early save, and training goes on (``notice`` is None on a rank that saves
        because another rank had the notice)."""
        if notice is not None:
            self.events.emit(
                "notice", step=self.step, source=notice.source, notice=notice.kind.value
            )
        self._wait_writer()
        if self._committed_step != self.step:
            self._save(block=False, reason="advisory")

    def _must_exit(self, notice: Notice) -> bool:
        remaining = (
            None
            if notice.deadline_monotonic is None
            else notice.deadline_monotonic - time.monotonic()
        )
        save_s = None if self.save_cost_s is None else self.save_cost_s + (self.write_s or 0.0)
        return notice_exit_due(
            remaining,
            step_s=self.step_s,
            save_s=save_s,
            margin_s=self.config.notice_margin,
            steps_per_check=1 if self._agreement is None else self._agreement.every,
        )

    def _emergency_exit(self, notice: Notice | None) -> None:
        """Save synchronously, acknowledge, and leave with exit code 75 (``notice`` is None on
        a rank that leaves because another rank had the notice)."""
        try:
            self._wait_writer()
        except SaveError as exc:
            log.warning("a background save failed (%s); saving synchronously now", exc)
        if self._committed_step != self.step:
            self._save(block=True, reason="notice")
        if self.mirror is not None:
            try:
                self.mirror.flush()
            except SaveError as exc:  # the local commit stands; the remote keeps an older one
                log.error("%s; exiting with the newest checkpoint on local disk only", exc)
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
        if self._ranks is not None:
            _leave_together(self._ranks)
        raise SystemExit(EXIT_INTERRUPTED)

    # --- saving ---------------------------------------------------------------------------------
    def _state(self, *, per_rank: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The live tensors and a detached JSON-able document of everything else (serialized
        on the saving thread, outside the stall). Under torch.distributed the models and
        optimizers are left to DCP, and the RNGs and extras (``per_rank=False``) to each
        rank's own files."""
        encoder = StateEncoder()
        sampler = None
        if self._batches is not None:
            sampler = self._batches.state_dict(self.epoch, self.batch_in_epoch)
        doc = {
            "spotwise": {
                "version": STATE_VERSION,
                "step": self.step,
                "epoch": self.epoch,
                "batch_in_epoch": self.batch_in_epoch,
                "seed": self.seed,
                "accumulate": self.accumulate,
            },
            "state": {
                name: encoder.encode(obj.state_dict(), f"state/{name}")
                for name, obj in self.state.items()
                if name not in self._sharded
            },
            "sampler": encoder.encode(sampler, "sampler"),
            "loader": None
            if self._position is None
            else encoder.encode(self._position.state_dict(), "loader"),
            "extras": encoder.encode(self.extras, "extras") if per_rank else None,
            "rng": encoder.encode(capture_rng(), "rng") if per_rank else None,
        }
        return encoder.tensors, doc

    def _rank_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """This rank's own part of a distributed checkpoint: its RNGs and extras."""
        encoder = StateEncoder()
        doc = {
            "extras": encoder.encode(self.extras, "extras"),
            "rng": encoder.encode(capture_rng(), "rng"),
        }
        return encoder.tensors, doc

    def _save_distributed(self, *, block: bool, reason: str) -> None:
        """A save with every rank. The training thread stalls for DCP's planning collectives
        and for packing this rank's tensors (copied into reused buffers unless ``block``); a
        background save's files are then written in a thread per rank and committed at a
        later step boundary once every rank's are (:class:`~spotwise.runtime.sharded.
        PendingSave`); a blocking one is written and committed here."""
        assert self._ranks is not None and self._plans is not None
        sharded = _sharded()
        started = time.perf_counter()
        step = self.step
        pack = sharded.pack_live
        if not block:
            self._staging = self._staging or sharded.StagingBuffers()
            pack = self._staging
        staged = sharded.stage(
            self._ranks,
            self.run_dir,
            step,
            self._sharded,
            self._state(per_rank=False),
            self._rank_state(),
            self._plans,
            pack,
            self._remote,
        )
        stall = time.perf_counter() - started
        self.save_cost_s = _smooth(self.save_cost_s, stall)
        self._last_save_step, self._last_save_time = step, time.monotonic()

        def committed(info: CheckpointInfo) -> None:  # on rank 0, where it commits
            self._retain_after(info, reason, stall, time.perf_counter() - started - stall)

        self._pending = sharded.PendingSave(
            self._ranks, staged, self.metrics, committed, self._save_pool
        )
        if block:
            self._wait_writer()  # written and committed here, on this thread
        else:
            self._pending.start()

    def _save(self, *, block: bool, reason: str) -> None:
        self._wait_writer()
        if self._ranks is not None:
            self._save_distributed(block=block, reason=reason)
            return
        started = time.perf_counter()
        tensors, state = self._state()
        blob = pack_tensors(tensors) if block else self._snapshot.capture(tensors)
        stall = time.perf_counter() - started
        self.save_cost_s = _smooth(self.save_cost_s, stall)
        self._last_save_step, self._last_save_time = self.step, time.monotonic()
        args = (self.step, blob, state, dict(self.metrics), reason, stall)
        if block:
            self._write(*args)
            return
        # on the Run's one saving thread, as a distributed save is; an error is raised on the
        # training thread at the next step
        self._writer = self._save_pool.submit(self._write, *args)

    def _write(
        self,
        step: int,
        blob: TensorBlob,
        state: dict[str, Any],
        metrics: dict[str, float],
        reason: str,
        stall_s: float,
    ) -> None:
        started = time.perf_counter()
        text = json.dumps(state).encode()
        info = write_checkpoint(self.run_dir, step, blob, text, metrics=metrics, kind=RUN_KIND)
        self._committed_step = step
        took = time.perf_counter() - started
        self.write_s = _smooth(self.write_s, took)
        deleted = self._retain_after(info, reason, stall_s, took)
        if self.mirror is not None:
            self.mirror.committed(info, deleted)

    def _retain_after(
        self, info: CheckpointInfo, reason: str, stall_s: float, write_s: float
    ) -> list[CheckpointInfo]:
        """Retention after a commit, and the commit's event, on the thread that committed (of
        the object store where the distributed commit went there)."""
        if self._remote is not None:
            policy = self.config.retention
            deleted = retain_remote(self._remote, policy, info.step, self._remote_scans)
        else:
            deleted = retain(self.run_dir, self.config.retention)
        self.events.emit(
            "checkpoint",
            step=info.step,
            reason=reason,
            bytes=info.size_bytes,
            stall_s=round(stall_s, 6),
            write_s=round(write_s, 6),
            deleted=[d.step for d in deleted],
        )
        return deleted

    def _settled(self, pending: PendingSave) -> None:
        """A distributed save committed, on every rank."""
        self._committed_step = pending.step
        self.write_s = _smooth(self.write_s, time.perf_counter() - pending.staged_at)

    def _raise_writer_error(self) -> None:
        if self._writer is None or not self._writer.done():
            return
        writer, self._writer = self._writer, None
        error = writer.exception()
        if error is not None:
            if isinstance(error, SaveError):
                message = f"background save failed: {error.message}"
                raise SaveError(message, hint=error.hint) from error
            raise SaveError(
                f"background save failed: {error!r}",
                hint="the previous checkpoints are intact; fix the cause and restart",
            ) from error

    def _wait_writer(self, quiet: bool = False) -> None:
        """Finish the background save, if any: under torch.distributed on every rank together
        (a collective), unless ``quiet``, where this rank only waits for its own thread."""
        pending, self._pending = self._pending, None
        if pending is not None:
            if quiet:
                pending.abandon()
                return
            pending.finish()
            self._settled(pending)
        if self._writer is not None:
            error = self._writer.exception()  # waits for it
            if quiet:
                if error is not None:
                    log.error("background save failed: %s", error)
                self._writer = None
                return
        self._raise_writer_error()

    # --- restoring ------------------------------------------------------------------------------
    def _resume(self) -> None:
        """Restore the newest checkpoint that loads and fits this Run's objects.

        One that loads but does not fit (a dropped or reshaped tensor, a changed dtype, no run
        state) is skipped with a warning naming its step and the reason, like one that does not
        load. Raises only when checkpoints loaded and none of them fits: then the objects are
        not the ones that wrote this directory, and guessing would train the wrong thing."""
        unfit: list[tuple[int, StateMismatchError]] = []
        candidates = (
            loadable_checkpoints(self.run_dir)
            if self._ranks is None
            else _sharded().agreed_checkpoints(self._ranks, self.run_dir, self._remote)
        )
        for loaded in candidates:
            try:
                self._restore(loaded)
                return
            except StateMismatchError as exc:
                unfit.append((loaded.info.step, exc))
                message = (
                    f"skipping checkpoint {loaded.info.path.name}: it does not fit this Run "
                    f"({exc.message}); falling back to an older one"
                )
                log.warning(message)
                warnings.warn(message, RuntimeWarning, stacklevel=3)
        if unfit:
            step, newest = unfit[0]
            raise StateMismatchError(
                f"none of the {len(unfit)} valid checkpoints in {self.run_dir} fits this Run; "
                f"the newest (step {step}): {newest.message}",
                hint=newest.hint
                or "pass the same objects as the run that wrote the checkpoints, or use a new "
                "run directory",
            ) from newest

    def _restore(self, loaded: LoadedCheckpoint) -> None:
        """Check that the whole checkpoint fits, then apply it. Everything that can be checked
        without touching the live objects is checked first, so a checkpoint that does not fit
        leaves them as they were; should applying still fail, the next checkpoint tried
        re-applies every object completely."""
        where = loaded.info.path
        doc = _upgrade_v1(loaded.doc)
        try:  # the checks that need no objects: a checkpoint Run wrote had them at loading
            counters = check_run_state(doc, loaded.info.step)
        except CorruptCheckpointError as exc:
            raise StateMismatchError(f"{where}: {exc.message}", hint=exc.hint) from exc
        meta = doc["spotwise"]
        if self._ranks is None and "world" in meta:
            raise StateMismatchError(
                f"{where} was written by {meta['world']!r} ranks under torch.distributed",
                hint="resume it under torchrun (--nproc-per-node 1 for a single process)",
            )
        if self._ranks is not None:
            _sharded().check_fits(where, doc, self._sharded)
        if counters["accumulate"] != self.accumulate:
            raise StateMismatchError(
                f"{where} was written with accumulate={counters['accumulate']}, this Run has "
                f"accumulate={self.accumulate}",
                hint="resume with the same accumulate=, or use a new run directory",
            )
        saved = doc["state"]
        if set(saved) != set(self.state) - set(self._sharded):
            raise StateMismatchError(
                f"{where} holds state {sorted(saved)}, this Run was given {sorted(self.state)}",
                hint="pass the same objects as the run that wrote the checkpoint, or use a "
                "new run directory",
            )
        for name, obj in self.state.items():
            if name in self._sharded:
                continue
            if isinstance(obj, torch.nn.Module):
                if not isinstance(saved[name], dict):
                    raise StateMismatchError(f"{where} holds no state dict for model {name!r}")
                check_module_state(name, obj, saved[name])
            elif isinstance(obj, torch.optim.Optimizer):
                _check_optimizer_state(where, name, obj, saved[name])
        if self._batches is not None and not isinstance(doc.get("sampler"), dict):
            raise StateMismatchError(f"{where} was saved without a data loader")
        if self._position is not None and not isinstance(doc.get("loader"), dict):
            raise StateMismatchError(
                f"{where} holds no state of a stateful data loader",
                hint="resume with the loader the run was started with, or a new run directory",
            )
        try:
            if self._batches is not None:
                self._batches.load_state_dict(doc["sampler"])
            if self._position is not None:
                self._position.load_state_dict(doc["loader"])
            if self._sharded:  # first: a collective, and the one read that can still fail
                _sharded().restore(self._ranks, loaded, doc, self._sharded)
            for name, obj in self.state.items():
                if name not in self._sharded:
                    obj.load_state_dict(saved[name])
            restore_rng(doc["rng"])  # last: a failing object leaves the RNGs untouched
        except StateMismatchError:
            raise
        except (RuntimeError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
            raise StateMismatchError(
                f"{where} does not fit this Run: {type(exc).__name__}: {exc}",
                hint="the objects differ from the run that wrote it; use a new run directory "
                "or restore the original configuration",
            ) from exc
        self.step, self.epoch = counters["step"], counters["epoch"]
        self.batch_in_epoch, self.seed = counters["batch_in_epoch"], counters["seed"]
        self._iter = None  # a stateful loader continues from the state just loaded
        self.extras = dict(doc["extras"] or {})
        self.metrics = dict(loaded.info.metrics)
        self._committed_step = self.step
        self.resumed_from = loaded.info
        log.info("resumed from %s (step %d)", where, self.step)
        self.events.emit("resume", step=self.step, checkpoint=where.name)

    def _acquire_lock(self) -> int | None:
        """The run directory's lock. Under torch.distributed only rank 0 holds it: it alone
        commits, prunes and cleans; the other ranks write only inside a temporary directory
        rank 0 created for the save at hand. Without a shared file system each rank locks its
        own. All ranks fail together when one is taken."""
        if self._ranks is None:
            return dirlock.acquire(self.run_dir)
        fd, error = None, None
        if self._ranks.is_coordinator or self._remote is not None:
            try:
                fd = dirlock.acquire(self.run_dir)
            except (CheckpointError, ConfigError) as exc:
                error = exc
        if not distributed.all_agree(self._ranks, error is None):
            if fd is not None:  # another rank's own directory was taken
                dirlock.release(fd)
            raise error or CheckpointError(
                "another rank could not lock its run directory",
                hint="another process (or another Run) is using it; see that rank's error",
            )
        return fd

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            dirlock.release(self._lock_fd)
            self._lock_fd = None


# --- helpers -----------------------------------------------------------------------------------
_NOTHING, _EARLY_SAVE, _EXIT = 0, 1, 2  # what a notice asks, ordered by urgency


def _leave_together(ranks: distributed.Ranks) -> None:
    """Wait until every rank has saved and closed, then ignore SIGTERM: the first rank to exit
    makes torchrun send SIGTERM to the others, which must still leave with exit 75, not -15."""
    distributed.all_agree(ranks, True)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _sharded() -> Any:
    """:mod:`spotwise.runtime.sharded`, imported only by distributed runs (it imports DCP)."""
    from spotwise.runtime import sharded

    return sharded


def _local_run_dir(run_dir: str | os.PathLike[str]) -> Path:
    text = os.fspath(run_dir)
    if text.startswith("file://"):
        text = text[len("file://") :]
    elif "://" in text:
        scheme = text.split("://", 1)[0]
        from spotwise.storage import object_store_schemes

        raise ConfigError(
            f"Run cannot use {scheme}:// run directories",
            hint="use a local path, file:///path or "
            + ", ".join(f"{s}bucket/prefix" for s in object_store_schemes()),
        )
    path = Path(text).expanduser()
    if path.exists() and not path.is_dir():
        raise ConfigError(f"run directory {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(
            f"cannot create run directory {path}: {exc.strerror}",
            hint="choose a writable location for --run-dir",
        ) from exc
    entries = os.listdir(path)
    foreign = [e for e in entries if not e.startswith(_OURS)]
    if foreign and not any(e.startswith(_OURS) for e in entries):
        raise ConfigError(
            f"{path} is not a spotwise run directory: it holds other files "
            f"({', '.join(sorted(foreign)[:3])}{', ...' if len(foreign) > 3 else ''})",
            hint="use a new or empty directory for the run, e.g. runs/<name>",
        )
    return path


_V1_SECTIONS = {
    "models": "model",
    "optimizers": "optimizer",
    "schedulers": "scheduler",
    "scalers": "scaler",
}


def _upgrade_v1(doc: Any) -> Any:
    """A version-1 document (objects in four fixed sections, ``main`` for a single one) in
    today's layout, so a run started before the upgrade resumes after it. Anything malformed
    is left as it is, for the checks that follow to refuse."""
    meta = doc.get("spotwise") if isinstance(doc, dict) else None
    if not isinstance(meta, dict) or meta.get("version") != 1:
        return doc
    sections = [doc.get(kind) for kind in _V1_SECTIONS]
    if not all(isinstance(section, dict) for section in sections):
        return doc
    state = {
        prefix if name == "main" else f"{prefix}.{name}": value
        for prefix, section in zip(_V1_SECTIONS.values(), sections, strict=True)
        for name, value in section.items()
    }
    upgraded = {k: v for k, v in doc.items() if k not in _V1_SECTIONS}
    upgraded["spotwise"] = {**meta, "version": STATE_VERSION, "accumulate": 1}
    upgraded["state"] = state
    return upgraded


def _check_optimizer_state(where: Path, name: str, optimizer: Any, saved: Any) -> None:
    """Refuse an optimizer state whose parameter groups differ from the live optimizer's (what
    ``load_state_dict`` would raise on), before any object has been modified."""
    live = optimizer.state_dict().get("param_groups")
    groups = saved.get("param_groups") if isinstance(saved, dict) else None
    if not isinstance(live, list):  # not a torch optimizer: its own load_state_dict decides
        return
    if (
        not isinstance(groups, list)
        or not isinstance(saved.get("state"), dict)
        or len(groups) != len(live)
        or any(
            not isinstance(g, dict)
            or not isinstance(g.get("params"), list)
            or len(g["params"]) != len(ours["params"])
            for g, ours in zip(groups, live, strict=False)
        )
    ):
        raise StateMismatchError(
            f"{where} does not fit optimizer {name!r}: its parameter groups differ",
            hint="the optimizer differs from the run that wrote it; use a new run directory or "
            "restore the original configuration",
        )


def _stateful(state: Mapping[str, Any] | None, **spelled: Any) -> dict[str, Any]:
    """The one mapping of checkpointed objects: ``state=`` plus the keyword spellings
    (``model=m`` is ``state={"model": m}``; a dict or list of them becomes ``model.<key>``)."""
    if state is not None and not isinstance(state, Mapping):
        raise ConfigError(
            f"state= takes a mapping of names to objects, got {type(state).__name__}",
            hint='pass state={"model": model, "optimizer": opt}',
        )
    named = {str(k): v for k, v in (state or {}).items()}
    for kind, obj in spelled.items():
        if obj is None:
            continue
        if isinstance(obj, Mapping):
            entries = {f"{kind}.{k}": v for k, v in obj.items()}
        elif isinstance(obj, (list, tuple)):
            entries = {f"{kind}.{i}": v for i, v in enumerate(obj)}
        else:
            entries = {kind: obj}
        for name, value in entries.items():
            if name in named:
                raise ConfigError(
                    f"two objects are named {name!r} (state= and {kind}=)",
                    hint="give each checkpointed object its own name",
                )
            named[name] = value
    for name, value in named.items():
        if not has_state(value):
            raise ConfigError(
                f"{name!r} ({type(value).__name__}) has no state_dict/load_state_dict",
                hint="pass torch models, optimizers, schedulers, scalers or other objects with "
                "state_dict()/load_state_dict(), or a dict/list of them",
            )
    return named


def _smooth(previous: float | None, sample: float) -> float:
    """Exponential moving average of a measured duration."""
    return sample if previous is None else 0.7 * previous + 0.3 * sample


def _draw_seed() -> int:
    """A seed drawn from torch's global RNG, so ``torch.manual_seed`` controls the data order."""
    return int(torch.randint(0, 2**62, (1,)).item())


__all__ = ["EXIT_INTERRUPTED", "Mirror", "Run"]
