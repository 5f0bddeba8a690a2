"""Which checkpoints to delete (:func:`choose_deletions`, a pure decision over what a listing
found, local or remote) and deleting them from a run directory (:func:`retain`)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from spotwise.checkpoint.durable import remove_logged
from spotwise.checkpoint.format import MANIFEST
from spotwise.checkpoint.read import CheckpointInfo, list_checkpoints
from spotwise.dirfd import open_dir, open_subdir

log = logging.getLogger(__name__)


class Listed(Protocol):
    """What retention needs to know of one checkpoint (``CheckpointInfo`` has it, local or
    remote)."""

    @property
    def step(self) -> int: ...

    @property
    def valid(self) -> bool: ...

    @property
    def metrics(self) -> Mapping[str, float]: ...


C = TypeVar("C", bound=Listed)


@dataclass(frozen=True)
class RetentionPolicy:
    keep_last: int = 3
    keep_best: int = 0
    best_metric: str | None = None
    best_mode: str = "min"  # "min" or "max"
    keep_every: int | None = None  # keep each checkpoint whose step is a multiple of this

    def __post_init__(self) -> None:
        if self.keep_last < 1:
            raise ValueError("keep_last must be at least 1: the newest checkpoint is always kept")
        if self.best_mode not in ("min", "max"):
            raise ValueError("best_mode must be 'min' or 'max'")
        if self.keep_best and not self.best_metric:
            raise ValueError("keep_best needs best_metric, the metric name to rank by")


def choose_deletions(checkpoints: Sequence[C], policy: RetentionPolicy) -> list[C]:
    """Which checkpoints to delete. Only valid ones count; invalid ones older than the newest
    valid are deleted too; invalid newer ones are left for inspection."""
    valid = sorted((c for c in checkpoints if c.valid), key=lambda c: c.step)
    if not valid:
        return []
    keep = {c.step for c in valid[-policy.keep_last :]}
    if policy.keep_every:
        keep |= {c.step for c in valid if c.step % policy.keep_every == 0}
    if policy.keep_best and policy.best_metric:
        metric = policy.best_metric
        ranked = sorted(
            (c for c in valid if metric in c.metrics),
            key=lambda c: c.metrics[metric] if policy.best_mode == "min" else -c.metrics[metric],
        )
        keep |= {c.step for c in ranked[: policy.keep_best]}
    newest = valid[-1].step
    doomed = [c for c in valid if c.step not in keep]
    doomed += [c for c in checkpoints if not c.valid and c.step < newest]
    return sorted(doomed, key=lambda c: c.step)


def delete_checkpoint(path: Path) -> None:
    """Remove the manifest first, so a half-deleted directory is never mistaken for valid. The
    directory is opened relative to the run directory without following links, so a link in
    its place is removed itself and nothing it points to is touched."""
    try:
        parent = open_dir(path.parent)
    except OSError as exc:
        log.warning("could not remove %s: %s", path, exc)
        return
    try:
        try:
            dir_fd = open_subdir(parent, path.name)
        except OSError:  # gone, or not a real directory: just the entry goes
            remove_logged(parent, path.name, path.parent)
            return
        try:
            os.unlink(MANIFEST, dir_fd=dir_fd)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("could not remove %s: %s", path / MANIFEST, exc)
        finally:
            os.close(dir_fd)
        remove_logged(parent, path.name, path.parent)
    finally:
        os.close(parent)


def retain(
    run_dir: str | os.PathLike[str],
    policy: RetentionPolicy,
    before_deleting: Callable[[list[CheckpointInfo]], object] | None = None,
) -> list[CheckpointInfo]:
    """Apply ``policy`` to ``run_dir`` and return what was deleted. Call it after a commit.

    ``before_deleting`` is told what will go before anything does: a second tier queues its
    upload of the new commit there, so the upload is not held back by the deletions (deleting
    1 GiB took 0.21-0.26 s on a disk mounted with ``discard``)."""
    doomed = choose_deletions(list_checkpoints(run_dir), policy)
    if before_deleting is not None:
        before_deleting(doomed)
    for info in doomed:
        delete_checkpoint(info.path)
    return doomed
