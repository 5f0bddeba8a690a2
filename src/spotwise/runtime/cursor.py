"""The loader cursor: where a run is in its data (epoch, batch in the epoch, the data order's
seed) and the iterator that continues from there.

A plain loader gets Run's resumable batch sampler (:func:`~spotwise.runtime.sampler.
make_resumable`); a stateful one (torchdata's ``StatefulDataLoader``, an ``IterableDataset``
with ``state_dict()``) keeps its own position, which is saved and loaded as it is. Either way
the batches after a resume are the ones the interrupted run would have seen.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from spotwise.errors import ConfigError, DataLoaderError, StateMismatchError
from spotwise.runtime.sampler import (
    ResumableBatchSampler,
    derive_seed,
    make_resumable,
    stateful_source,
)
from spotwise.runtime.workers import LoaderWorkers

log = logging.getLogger(__name__)

# a loader whose workers die this often at one position has a problem a restart does not fix
MAX_LOADER_RESTARTS = 2


class LoaderCursor:
    """The position in the data and, with a loader, the batches from there on."""

    def __init__(self, loader: Any, seed: int) -> None:
        self.epoch = 0
        self.batch_in_epoch = 0
        self.seed = seed
        self.loader: Any = None
        self._batches: ResumableBatchSampler | None = None  # our sampler, for plain loaders
        self._position: Any = None  # what keeps a stateful loader's position
        self._workers: LoaderWorkers | None = None
        self._iter: Iterator[Any] | None = None
        self._empty_epochs = 0
        self._failures: tuple[tuple[int, int], int] = ((-1, -1), 0)  # position, count
        if loader is None:
            return
        group = torch.distributed.is_available() and torch.distributed.is_initialized()
        rank = torch.distributed.get_rank() if group else 0
        world = torch.distributed.get_world_size() if group else 1
        self._position = stateful_source(loader, world=world)
        if self._position is None:
            self.loader, self._batches = make_resumable(loader, seed, rank=rank, world=world)
            if len(self._batches) == 0:
                raise ConfigError("the data loader yields no batches (empty dataset?)")
        else:
            self.loader = loader
        if isinstance(self.loader, DataLoader):
            self._workers = LoaderWorkers(self.loader)

    @property
    def keeps_own_position(self) -> bool:
        """A stateful loader: its position is its own, so a failed iterator is not rerun."""
        return self._position is not None

    def next(self) -> Any:
        """The next batch, across epochs; raises DataLoaderError when a worker died."""
        while True:
            if self._iter is None:
                self._iter = self._start()
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
            except DataLoaderError:
                self._iter = None
                raise

    def rerun_after(self, failure: DataLoaderError) -> None:
        """A worker died between two steps (a signal it could not ignore, the OOM killer): the
        loader starts again at the same position, which yields the same batches (each batch
        carries its own seed). A worker that keeps dying at one position, or a stateful loader
        (whose position moved on), raises ``failure``."""
        if self._position is not None:
            raise failure
        position = (self.epoch, self.batch_in_epoch)
        seen, count = self._failures
        count = count + 1 if seen == position else 1
        self._failures = (position, count)
        if count > MAX_LOADER_RESTARTS:
            raise failure
        log.warning(
            "spotwise: %s; restarting the data loader at epoch %d, batch %d",
            failure.message,
            *position,
        )

    def _start(self) -> Iterator[Any]:
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

    def stop(self) -> None:
        """End the iterator's workers now. A stateful loader keeps a reference to its iterator
        (for ``state_dict``), so dropping ours would leave them waiting for work, and the
        interpreter's exit waiting for them."""
        iterator, self._iter = self._iter, None
        shutdown = getattr(iterator, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def close(self) -> None:
        if self._workers is not None:
            self._workers.close()

    # --- saved and restored with the checkpoint ---------------------------------------------
    def sampler_state(self) -> Any:
        """Run's sampler's position to save (None with a stateful loader or none)."""
        if self._batches is None:
            return None
        return self._batches.state_dict(self.epoch, self.batch_in_epoch)

    def loader_state(self) -> Any:
        """A stateful loader's own state to save (None otherwise)."""
        return None if self._position is None else self._position.state_dict()

    def check(self, where: Path, doc: Mapping[str, Any]) -> None:
        """Refuse a checkpoint that holds no position for this cursor's kind of loader."""
        if self._batches is not None and not isinstance(doc.get("sampler"), dict):
            raise StateMismatchError(f"{where} was saved without a data loader")
        if self._position is not None and not isinstance(doc.get("loader"), dict):
            raise StateMismatchError(
                f"{where} holds no state of a stateful data loader",
                hint="resume with the loader the run was started with, or a new run directory",
            )

    def load(self, doc: Mapping[str, Any]) -> None:
        """Apply the position of a checkpoint :meth:`check` accepted."""
        if self._batches is not None:
            self._batches.load_state_dict(doc["sampler"])
        if self._position is not None:
            self._position.load_state_dict(doc["loader"])

    def move_to(self, epoch: int, batch_in_epoch: int, seed: int) -> None:
        """Continue from a restored position (a stateful loader from the state just loaded)."""
        self.epoch, self.batch_in_epoch, self.seed = epoch, batch_in_epoch, seed
        self._iter = None
