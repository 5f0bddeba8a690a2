"""Saving a Run under torch.distributed: models and optimizers through DCP, every rank writing
its share (:mod:`spotwise.runtime.distributed.sharded`), committed by rank 0 into the shared run
directory or, without a shared file system, into the object store. The ranks act together: at step
boundaries they agree (:class:`~spotwise.runtime.distributed.Agreement`) on notices, timed
saves and when a background save's phases end. Imported only by distributed runs (it imports
DCP)."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from spotwise.checkpoint.read import CheckpointInfo
from spotwise.checkpoint.remote import RemoteCheckpoint, open_remote
from spotwise.checkpoint.retention import retain
from spotwise.checkpoint.writeway import way_name
from spotwise.runtime import distributed
from spotwise.runtime.commit import LoadedCheckpoint
from spotwise.runtime.config import CheckpointConfig
from spotwise.runtime.distributed import sharded
from spotwise.runtime.saver.base import NOTHING, Capture, CaptureRank, Saver, smooth
from spotwise.runtime.tiered import retain_remote
from spotwise.storage.base import Storage
from spotwise.telemetry.events import EventLog


class DistributedSaver(Saver):
    """One rank of a torchrun job; ``remote`` is the object store where the ranks commit when
    they share no file system."""

    solo = False

    def __init__(
        self,
        run_dir: Path,
        config: CheckpointConfig,
        events: EventLog,
        ranks: distributed.Ranks,
        state: Mapping[str, Any],
        remote_uri: str | None,
    ) -> None:
        super().__init__(run_dir, config, events)
        self.ranks = ranks
        self._agreement = distributed.Agreement(ranks, distributed.round_trip_s(ranks))
        self.sharded = sharded.sharded_objects(state)
        self._remote: Storage | None = None
        if remote_uri is not None:
            self._remote = open_remote(remote_uri)
        self._remote_scans: dict[str, RemoteCheckpoint] = {}  # retention's cache of manifests
        self._pending: sharded.PendingSave | None = None
        self._staging: sharded.StagingBuffers | None = None  # a background save's buffers
        self._plans = sharded.SavePlans()

    @property
    def owns_dir(self) -> bool:
        return self.ranks.is_coordinator or self._remote is not None

    @property
    def steps_per_check(self) -> int:
        return self._agreement.every

    def common_seed(self, seed: int) -> int:
        return distributed.broadcast_ints(self.ranks, [seed])[0]  # rank 0's

    def prepare(self) -> None:
        """No second tier: the ranks read the object store themselves."""

    def checkpoints(self) -> Iterator[LoadedCheckpoint]:
        return sharded.agreed_checkpoints(self.ranks, self.run_dir, self._remote)

    def check_fits(self, where: Path, doc: Any) -> None:
        sharded.check_fits(where, doc, self.sharded)

    def load_sharded(self, loaded: LoadedCheckpoint, doc: Any) -> None:
        if self.sharded:
            sharded.restore(self.ranks, loaded, doc, self.sharded)

    def save(
        self,
        step: int,
        metrics: Mapping[str, float],
        capture: Capture,
        capture_rank: CaptureRank,
        *,
        block: bool,
        reason: str,
    ) -> None:
        """A save with every rank. The training thread stalls for DCP's planning collectives
        and for packing this rank's tensors (copied into reused buffers unless ``block``); a
        background save's files are then written in a thread per rank and committed at a
        later step boundary once every rank's are (:class:`~spotwise.runtime.distributed.sharded.
        PendingSave`); a blocking one is written and committed here."""
        started = time.perf_counter()
        pack = sharded.pack_live
        if not block:
            self._staging = self._staging or sharded.StagingBuffers()
            pack = self._staging
        staged = sharded.stage(
            self.ranks,
            self.run_dir,
            step,
            self.sharded,
            capture(False),
            capture_rank(),
            self._plans,
            pack,
            self._remote,
        )
        staged.direct = self._direct(reason)
        stall = time.perf_counter() - started
        self.stats.staged(step, stall)

        def committed(info: CheckpointInfo) -> None:  # on rank 0, where it commits
            took = time.perf_counter() - started - stall
            self._retain_after(info, reason, stall, took, way_name(staged.direct))

        self._pending = sharded.PendingSave(self.ranks, staged, metrics, committed, self._pool)
        if block:
            self.wait()  # written and committed here, on this thread
        else:
            self._pending.start()

    def poll(self, propose: Callable[[], int], due: bool) -> tuple[int, bool]:
        """Every rank acts as the most urgent of them, together, one agreement after it was
        proposed. A timed save waits for an agreement (step counts are the same everywhere)."""
        schedule = self.config.schedule
        timed = schedule.seconds is not None or schedule.auto
        pending = self._pending
        agreed = self._agreement.boundary(
            lambda: [propose(), int(due and timed), 0 if pending is None else pending.busy()]
        )
        if timed:  # only as agreed: between agreements a timed save waits for the next one
            due = agreed is not None and bool(agreed[1])
        if agreed is None:
            return NOTHING, due
        action, _, writing = agreed
        if pending is not None:  # a failed save is not retried: dropped before it raises
            self._pending = None
            if pending.agreed(writing):  # committed, on every rank at this boundary
                self._settled(pending)
            else:
                self._pending = pending
        return action, due

    def wait(self, quiet: bool = False) -> None:
        """Under torch.distributed on every rank together (a collective), unless ``quiet``."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        if quiet:
            pending.abandon()
            return
        pending.finish()
        self._settled(pending)

    def flush(self) -> None:
        """Committed is where it stays: no second tier."""

    def leave(self) -> None:
        """Wait until every rank has saved and closed, then ignore SIGTERM: the first rank to
        exit makes torchrun send SIGTERM to the others, which must still leave with exit 75,
        not -15."""
        distributed.all_agree(self.ranks, True)
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def _finish(self) -> None:
        self._agreement.drain()
        # every rank is done with the Run's gloo group before any of them goes on: a
        # destroy_process_group() right after close() on one rank while another still had the
        # group's pairs open aborted it ("terminate called without an active exception")
        distributed.all_agree(self.ranks, True)
        self.wait()

    def _settled(self, pending: sharded.PendingSave) -> None:
        """A distributed save committed, on every rank."""
        self.stats.committed_step = pending.step
        self.stats.write_s = smooth(self.stats.write_s, time.perf_counter() - pending.staged_at)
        self._way.record(pending.staged.direct, *pending.timed_write)

    def _retain(self, info: CheckpointInfo) -> list[CheckpointInfo]:
        """Of the object store where the commit went there."""
        if self._remote is not None:
            policy = self.config.retention
            return retain_remote(self._remote, policy, info.step, self._remote_scans)
        return retain(self.run_dir, self.config.retention)
