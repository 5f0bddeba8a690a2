"""Saving a single-process Run: the whole state in one checkpoint directory, written by the
Run's saving thread after the stall of copying the tensors (or at once, blocking), and behind
it an optional second tier (a :class:`Mirror`, the object store of an ``s3://`` run
directory)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from spotwise.checkpoint.read import CheckpointInfo
from spotwise.checkpoint.retention import retain
from spotwise.checkpoint.writeway import way_name
from spotwise.errors import SaveError, StateMismatchError
from spotwise.runtime.commit import LoadedCheckpoint, loadable_checkpoints, write_checkpoint
from spotwise.runtime.config import CheckpointConfig
from spotwise.runtime.format import TensorBlob, pack_tensors
from spotwise.runtime.saver.base import Capture, CaptureRank, Saver, smooth
from spotwise.runtime.snapshot import SnapshotBuffer
from spotwise.runtime.state import RUN_KIND
from spotwise.telemetry.events import EventLog

log = logging.getLogger(__name__)


@runtime_checkable
class Mirror(Protocol):
    """A second tier behind the local run directory (for example an object store).

    ``restore`` runs once at start, before the local directory is searched, and may place the
    newest remote checkpoint there; ``committed`` runs on the saving thread after every local
    commit, given the checkpoints retention is about to delete (they go once it returns, so it
    should only queue its work); ``flush`` blocks until everything committed is safe remotely
    (called before the final exit and before exiting on a notice).
    """

    def restore(self, run_dir: Path) -> None: ...

    def committed(self, checkpoint: CheckpointInfo, deleted: Sequence[CheckpointInfo]) -> None: ...

    def flush(self) -> None: ...


class SingleSaver(Saver):
    """One process: its saves go through one background thread, one at a time."""

    def __init__(
        self, run_dir: Path, config: CheckpointConfig, events: EventLog, mirror: Mirror | None
    ) -> None:
        super().__init__(run_dir, config, events)
        self.mirror = mirror
        self._snapshot = SnapshotBuffer()
        self._writer: Future[None] | None = None

    def prepare(self) -> None:
        if self.mirror is not None:
            self.mirror.restore(self.run_dir)

    def checkpoints(self) -> Iterator[LoadedCheckpoint]:
        return loadable_checkpoints(self.run_dir)

    def check_fits(self, where: Path, doc: Any) -> None:
        meta = doc["spotwise"]
        if "world" in meta:
            raise StateMismatchError(
                f"{where} was written by {meta['world']!r} ranks under torch.distributed",
                hint="resume it under torchrun (--nproc-per-node 1 for a single process)",
            )

    def load_sharded(self, loaded: LoadedCheckpoint, doc: Any) -> None:
        """Nothing is sharded in a single process."""

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
        started = time.perf_counter()
        tensors, state = capture(True)
        blob = pack_tensors(tensors) if block else self._snapshot.capture(tensors)
        stall = time.perf_counter() - started
        self.stats.staged(step, stall)
        args = (step, blob, state, dict(metrics), reason, stall, self._direct(reason))
        if block:
            self._write(*args)
            return
        # on the Run's one saving thread, as a distributed save is; an error is raised on the
        # training thread at the next step
        self._writer = self._pool.submit(self._write, *args)

    def poll(self, propose: Callable[[], int], due: bool) -> tuple[int, bool]:
        self._raise_error()
        return propose(), due

    def wait(self, quiet: bool = False) -> None:
        if self._writer is not None:
            error = self._writer.exception()  # waits for it
            if quiet:
                if error is not None:
                    log.error("background save failed: %s", error)
                self._writer = None
                return
        self._raise_error()

    def flush(self) -> None:
        if self.mirror is not None:
            try:
                self.mirror.flush()
            except SaveError as exc:  # the local commit stands; the remote keeps an older one
                log.error("%s; exiting with the newest checkpoint on local disk only", exc)

    def leave(self) -> None:
        """Nobody else to wait for."""

    def _finish(self) -> None:
        self.wait()
        if self.mirror is not None:
            self.mirror.flush()

    def _write(
        self,
        step: int,
        blob: TensorBlob,
        state: dict[str, Any],
        metrics: dict[str, float],
        reason: str,
        stall_s: float,
        direct: bool,
    ) -> None:
        started = time.perf_counter()
        text = json.dumps(state).encode()
        info = write_checkpoint(
            self.run_dir, step, blob, text, metrics=metrics, kind=RUN_KIND, direct=direct
        )
        self.stats.committed_step = step
        took = time.perf_counter() - started
        self.stats.write_s = smooth(self.stats.write_s, took)
        self._way.record(direct, info.size_bytes, took)
        self._retain_after(info, reason, stall_s, took, way_name(direct))

    def _retain(self, info: CheckpointInfo) -> list[CheckpointInfo]:
        """The mirror gets the commit before retention deletes anything: its upload, which an
        exit on a notice waits for, runs beside the deletions instead of after them."""
        mirror = self.mirror
        if mirror is None:
            return retain(self.run_dir, self.config.retention)
        return retain(
            self.run_dir, self.config.retention, lambda doomed: mirror.committed(info, doomed)
        )

    def _raise_error(self) -> None:
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
