"""The saver interface: the one object of a Run that knows whether it runs alone or as one rank
of many, so the loop branches on neither.

A Run saves with :meth:`Saver.save`, calls :meth:`Saver.poll` at every step boundary (a failed
background save raises there; under torch.distributed the ranks agree there on what to do) and
:meth:`Saver.wait` whenever a save must be finished. At construction it lists the checkpoints
to resume from (:meth:`Saver.checkpoints`) and loads what only the saver knows how to
(:meth:`Saver.check_fits`, :meth:`Saver.load_sharded`).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from spotwise.checkpoint.read import CheckpointInfo
from spotwise.checkpoint.writeway import WriteWay
from spotwise.runtime.commit import LoadedCheckpoint
from spotwise.runtime.config import CheckpointConfig
from spotwise.telemetry.events import EventLog

# the live tensors and a detached JSON-able document of everything else; ``per_rank`` False
# leaves the RNGs and extras out (under torch.distributed each rank saves its own)
Capture = Callable[[bool], tuple[dict[str, torch.Tensor], dict[str, Any]]]
# this rank's own RNGs and extras
CaptureRank = Callable[[], tuple[dict[str, torch.Tensor], dict[str, Any]]]

NOTHING, EARLY_SAVE, EXIT = 0, 1, 2  # what a notice asks, ordered by urgency

# the saves that may try the way to write that is not the best known: not the one made on a
# notice, nor the last one of a run (no later save would gain from what it measures)
_MAY_TRY = frozenset({"interval", "manual", "advisory"})


@dataclass
class SaveStats:
    """What the interval and the notice margin are computed from, and telemetry reads."""

    committed_step: int | None = None
    last_step: int = 0  # of the last save started
    last_time: float = field(default_factory=time.monotonic)
    save_cost_s: float | None = None  # smoothed blocking cost of a save
    write_s: float | None = None  # smoothed duration of a background write

    def staged(self, step: int, stall_s: float) -> None:
        """A save of ``step`` stopped training for ``stall_s``."""
        self.save_cost_s = smooth(self.save_cost_s, stall_s)
        self.last_step, self.last_time = step, time.monotonic()


class Saver(ABC):
    """Writes a Run's checkpoints into ``run_dir``, commits them, keeps what retention keeps."""

    solo = True  # acts on a notice at once; under torch.distributed all ranks agree first

    def __init__(self, run_dir: Path, config: CheckpointConfig, events: EventLog) -> None:
        self.run_dir, self.config, self.events = run_dir, config, events
        self.stats = SaveStats()
        self.sharded: Mapping[str, Any] = {}  # the objects saved through DCP, by name
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="spotwise-save")  # one, reused
        self._way = WriteWay()  # direct or through the page cache, as measured

    @property
    def owns_dir(self) -> bool:
        """Whether this process locks and cleans ``run_dir`` (and writes the run's events)."""
        return True

    @property
    def steps_per_check(self) -> int:
        """Step boundaries between two looks at the notices."""
        return 1

    @abstractmethod
    def prepare(self) -> None:
        """Before resuming: bring the newest checkpoint of another tier into ``run_dir``."""

    @abstractmethod
    def checkpoints(self) -> Iterator[LoadedCheckpoint]:
        """The checkpoints to resume from, loaded and verified, newest first."""

    @abstractmethod
    def check_fits(self, where: Path, doc: Any) -> None:
        """Refuse (StateMismatchError) a document that another mode of saving wrote."""

    @abstractmethod
    def load_sharded(self, loaded: LoadedCheckpoint, doc: Any) -> None:
        """Load the objects in :attr:`sharded` from ``loaded``."""

    def common_seed(self, seed: int) -> int:
        """The data order's seed, the same in every process of the job."""
        return seed

    @abstractmethod
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
        """Save ``step`` (after the previous save finished): committed before returning with
        ``block``, else written in the background after the stall of capturing it."""

    @abstractmethod
    def poll(self, propose: Callable[[], int], due: bool) -> tuple[int, bool]:
        """At a step boundary: raise a failed background save, and return what to do about
        notices (``propose`` gives this process's view) and whether the save that this
        process finds ``due`` is due."""

    @abstractmethod
    def wait(self, quiet: bool = False) -> None:
        """Finish the background save, if any, raising its error; ``quiet`` only waits for
        this process's part and logs an error (for a Run ending on an error)."""

    @abstractmethod
    def flush(self) -> None:
        """Before exiting on a notice: push what is committed to the other tier, if any."""

    @abstractmethod
    def leave(self) -> None:
        """After closing, before exiting on a notice."""

    def close(self) -> None:
        """Finish everything in flight (raising a failed save) and stop the saving thread."""
        try:
            self._finish()
        finally:
            self._pool.shutdown()

    def _finish(self) -> None:
        self.wait()

    def _retain_after(
        self, info: CheckpointInfo, reason: str, stall_s: float, write_s: float, written: str
    ) -> None:
        """Retention after a commit, and the commit's event (``written``: the way chosen for
        its large files), on the thread that committed. The event is written even when
        retention fails (a second tier refusing the commit, say): the commit stands."""
        deleted: list[CheckpointInfo] = []
        try:
            deleted = self._retain(info)
        finally:
            self.events.emit(
                "checkpoint",
                step=info.step,
                reason=reason,
                bytes=info.size_bytes,
                stall_s=round(stall_s, 6),
                write_s=round(write_s, 6),
                written=written,
                deleted=[d.step for d in deleted],
            )

    def _direct(self, reason: str) -> bool:
        """Whether the save made for ``reason`` writes its large files directly."""
        return self._way.direct(may_try=reason in _MAY_TRY)

    @abstractmethod
    def _retain(self, info: CheckpointInfo) -> list[CheckpointInfo]: ...


def smooth(previous: float | None, sample: float) -> float:
    """Exponential moving average of a measured duration."""
    return sample if previous is None else 0.7 * previous + 0.3 * sample
