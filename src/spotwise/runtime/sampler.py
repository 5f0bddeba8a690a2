"""Resumable sampling: a mid-epoch resume yields exactly the batches the uninterrupted run would.

Three things make a ``DataLoader`` repeatable across a restart:

- the epoch's permutation is a function of (seed, epoch) and is saved with its position, so the
  resumed loader starts *at* the next batch instead of replaying earlier ones;
- the loader gets its own ``torch.Generator``, so creating an iterator never draws from the
  global torch RNG (which would shift dropout and everything after it);
- each batch carries a seed derived from (seed, epoch, its place in the epoch's order) that
  worker processes apply before loading it, so random augmentation in ``num_workers > 0`` does
  not depend on which worker got the batch or how long the workers had been running.

Under torch.distributed the epoch's one global permutation is dealt across the ranks step by
step and the saved position is global, so a resume at the same world size is bit-identical and
one at another world size continues the same order (each sample of the epoch once).
"""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    get_worker_info,
)

from spotwise.errors import ConfigError, StateMismatchError
from spotwise.runtime.workers import WorkerInit

log = logging.getLogger(__name__)


def derive_seed(*parts: int | str) -> int:
    """A well-mixed 63-bit seed from several parts (stable across Python versions)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class SeededBatch(list):
    """A list of dataset indices that also carries the seed for loading it."""

    def __init__(self, indices: list[int], seed: int) -> None:
        super().__init__(indices)
        self.seed = seed


def epoch_steps(
    remaining: int, batch_size: int, world: int, drop_last: bool
) -> tuple[int, tuple[int, ...]]:
    """How the rest of an epoch (``remaining`` samples of its global order) is dealt into steps:
    the number of full steps of ``world * batch_size`` samples, then the sizes of the (at most
    two) smaller steps after them. Every rank takes part in every step with at least one
    sample, so all ranks run the same number of steps (a rank with one step more would wait
    forever in DDP's all-reduce).

    With ``drop_last`` every per-rank batch is full and the remainder is dropped, as a
    single-process ``DataLoader`` does. Otherwise the remainder is one more step, split as
    evenly as the ranks allow (shares differ by at most one sample); a remainder smaller than
    the world is merged with the last full step into two balanced steps. Only when there is
    no full step to merge with, or ``batch_size`` is 1, are those fewer-than-``world`` samples
    dropped. At world 1 nothing is dropped without ``drop_last``.
    """
    per_step = world * batch_size
    full, rest = divmod(remaining, per_step)
    if rest == 0 or drop_last:
        return full, ()
    if rest >= world:
        return full, (rest,)
    if full and batch_size > 1:
        pair = per_step + rest  # >= 2 * world, so each of the two steps feeds every rank
        return full - 1, ((pair + 1) // 2, pair // 2)
    return full, ()


class ResumableBatchSampler(Sampler[list[int]]):
    """Yields this rank's batches of one epoch, starting at ``position``; call
    :meth:`set_position` before each new iterator.

    The epoch has one global order (the permutation of (seed, epoch)); each step (one batch on
    every rank: a micro-batch under accumulation) consumes the next ``world * batch_size``
    samples of it and rank ``r`` takes the contiguous ``r``-th share, so rank ``r``'s batch at
    a full step is exactly the batch a single process would have drawn at index
    ``step * world + r``, with the same seed. What is saved is the
    number of samples of the global order consumed, the same on every rank: loading it at any
    world size continues the same order, none twice, none skipped (see :func:`epoch_steps`
    for the tail).

    ``position`` counts this sampler's steps in the epoch as the training loop does. After a
    checkpoint written at another world size is loaded, the loop keeps the saved count and the
    sampler counts its steps on from it: (position, consumed) of the checkpoint is the origin
    of the resumed epoch; later epochs count from their start.
    """

    def __init__(
        self,
        size: int,
        batch_size: int,
        *,
        shuffle: bool,
        drop_last: bool,
        seed: int,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        if world < 1 or not 0 <= rank < world:
            raise ConfigError(
                f"rank {rank} of world size {world} is not a process of that world",
                hint="pass world >= 1 and 0 <= rank < world (torch.distributed's get_rank() "
                "and get_world_size())",
            )
        self.size, self.batch_size = size, batch_size
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.rank, self.world = rank, world
        self.epoch = 0
        self.position = 0  # index of the next batch to yield within the epoch
        self._perm: tuple[int, torch.Tensor] | None = None  # (epoch, permutation)
        self._origin: tuple[int, int, int] | None = None  # loaded (epoch, position, consumed)

    def _plan(self, epoch: int) -> tuple[int, int, int, tuple[int, ...]]:
        """(position, consumed) that ``epoch``'s steps are counted from, and the number of
        full steps and the sizes of the smaller steps after that point."""
        start, offset = 0, 0
        if self._origin is not None and self._origin[0] == epoch:
            start, offset = self._origin[1], self._origin[2]
        full, tail = epoch_steps(self.size - offset, self.batch_size, self.world, self.drop_last)
        return start, offset, full, tail

    def __len__(self) -> int:
        start, _, full, tail = self._plan(self.epoch)
        return start + full + len(tail)

    def step_at(self, epoch: int, position: int) -> tuple[int, int]:
        """(global offset, number of samples) of step ``position`` of ``epoch``; past the
        epoch's last step, (dataset size, 0): the whole epoch is consumed."""
        start, offset, full, tail = self._plan(epoch)
        index = position - start
        if index < 0:
            raise ValueError(
                f"position {position} precedes the resumed position {start} of epoch {epoch}"
            )
        if index < full:
            return offset + index * self.world * self.batch_size, self.world * self.batch_size
        index -= full
        if index < len(tail):
            return offset + full * self.world * self.batch_size + sum(tail[:index]), tail[index]
        return self.size, 0

    def permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is not None and self._perm[0] == epoch:
            return self._perm[1]
        if self.shuffle:
            generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch, "perm"))
            perm = torch.randperm(self.size, generator=generator)
        else:
            perm = torch.arange(self.size)
        self._perm = (epoch, perm)
        return perm

    def set_position(self, epoch: int, position: int) -> None:
        self.epoch, self.position = epoch, position

    def batch_seed(self, epoch: int, first: int) -> int:
        """The seed of the batch whose first sample is at global offset ``first``: a function
        of where the batch lies in the epoch's order, hence of the step and the rank, never of
        the world size or of which worker loads it. Counted in batches where aligned (every
        full step), so a single-process run's seeds are its batch indices, as in checkpoints
        of earlier versions."""
        index, rest = divmod(first, self.batch_size)
        if rest == 0:
            return derive_seed(self.seed, epoch, index, "batch")
        return derive_seed(self.seed, epoch, index, rest, "batch")

    def __iter__(self) -> Iterator[list[int]]:
        epoch, end = self.epoch, len(self)
        perm = self.permutation(epoch).tolist()
        for position in range(self.position, end):
            offset, count = self.step_at(epoch, position)
            share, extra = divmod(count, self.world)
            first = offset + self.rank * share + min(self.rank, extra)
            mine = share + (1 if self.rank < extra else 0)
            yield SeededBatch(perm[first : first + mine], self.batch_seed(epoch, first))

    def state_dict(self, epoch: int, position: int) -> dict[str, Any]:
        """The state for resuming at batch ``position`` of ``epoch`` (the training loop's
        position, which lags behind what prefetching workers have already drawn). It is the
        same on every rank."""
        return {
            "size": self.size,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "seed": self.seed,
            "epoch": epoch,
            "position": position,
            "consumed": self.step_at(epoch, position)[0],  # global samples of the epoch
            "world": self.world,
            # the permutation itself, so a torch upgrade cannot change the rest of this epoch
            "permutation": self.permutation(epoch).to(torch.int64),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for key in ("size", "batch_size", "shuffle", "drop_last"):
            if state[key] != getattr(self, key):
                raise StateMismatchError(
                    f"the data loader changed since the checkpoint: {key} was {state[key]!r}, "
                    f"now {getattr(self, key)!r}",
                    hint="resume with the same dataset and batch size, or start a new run "
                    "directory",
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        # single-process checkpoints of earlier versions hold only the batch position
        consumed = int(state.get("consumed", min(position * self.batch_size, self.size)))
        if position < 0 or not 0 <= consumed <= self.size:
            raise StateMismatchError(
                f"the saved data position (batch {position}, {consumed} samples consumed) "
                f"does not fit the dataset of {self.size} samples"
            )
        perm = state["permutation"]
        if perm.numel() != self.size:
            raise StateMismatchError("the saved permutation does not match the dataset size")
        saved_world = int(state.get("world", 1))
        if saved_world != self.world:
            log.info(
                "spotwise: resuming the data order of world size %d at world size %d, after "
                "%d of %d samples of epoch %d",
                saved_world,
                self.world,
                consumed,
                self.size,
                epoch,
            )
        self.seed = int(state["seed"])
        self._origin = (epoch, position, consumed)
        self.set_position(epoch, position)
        self._perm = (epoch, perm.clone())


class SeededDataset(Dataset):
    """Wraps a map-style dataset; in worker processes, seeds Python, NumPy and torch from the
    batch's seed before loading it."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, batch: list[int]) -> list[Any]:
        seed = getattr(batch, "seed", None)
        if seed is not None and get_worker_info() is not None:
            random.seed(seed)
            np.random.seed(seed % (1 << 32))
            torch.manual_seed(seed)
        inner = getattr(self.dataset, "__getitems__", None)
        if inner is not None:
            return list(inner(list(batch)))
        return [self.dataset[i] for i in batch]


def has_state(obj: Any) -> bool:
    """Whether ``obj`` follows the ``state_dict()``/``load_state_dict()`` protocol."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _refuse_sharding(source: Any, world: int) -> None:
    """A stateful loader's ``state_dict()`` is one process's stream position: Run can neither
    deal it across ranks nor continue it at another world size, so it is refused at world > 1
    rather than trained on in an order no resume could repeat."""
    if world > 1:
        raise ConfigError(
            f"Run cannot shard the stateful {type(source).__name__} across {world} ranks: its "
            "state_dict() holds one process's position, which says nothing of the other ranks "
            "and cannot be resumed at another world size",
            hint="under torch.distributed pass a map-style DataLoader(dataset, batch_size=B, "
            "shuffle=True); Run deals its permutation across the ranks and resumes it at any "
            "world size",
        )


def stateful_source(loader: Any, *, world: int = 1) -> Any | None:
    """What to checkpoint for a loader that keeps its own position, or None for a plain
    map-style ``DataLoader`` (which :func:`make_resumable` rebuilds around a resumable sampler).

    A loader with ``state_dict``/``load_state_dict`` (torchdata's ``StatefulDataLoader``) is
    saved through them, and so is the dataset of a ``DataLoader(num_workers=0)`` over an
    ``IterableDataset`` that has them (Hugging Face ``datasets`` iterable datasets do). What
    cannot say where it is is refused: replaying it from the start would train on some data
    twice and some never. So is a stateful loader at ``world`` > 1 (see :func:`_refuse_sharding`).
    """
    if has_state(loader):
        _refuse_sharding(loader, world)
        if isinstance(loader, DataLoader) and loader.num_workers > 0:
            loader.worker_init_fn = WorkerInit(loader.worker_init_fn)  # workers ignore notices
        return loader
    if not isinstance(loader, DataLoader):
        raise ConfigError(
            f"loader {type(loader).__name__} is neither a DataLoader nor has "
            "state_dict()/load_state_dict()",
            hint="pass a torch DataLoader, or torchdata's StatefulDataLoader",
        )
    if not isinstance(loader.dataset, IterableDataset):
        return None
    dataset = loader.dataset
    if not has_state(dataset):
        raise ConfigError(
            f"Run cannot resume the IterableDataset {type(dataset).__name__} mid-stream: it "
            "has no state_dict()/load_state_dict(), so its position cannot be saved",
            hint="give the dataset state_dict()/load_state_dict() (Hugging Face datasets' "
            "IterableDataset has them), or use a map-style Dataset",
        )
    _refuse_sharding(dataset, world)
    if loader.num_workers > 0:
        raise ConfigError(
            f"a DataLoader with num_workers={loader.num_workers} over an IterableDataset keeps "
            "the stream position in its worker processes, where Run cannot read it",
            hint="use torchdata.stateful_dataloader.StatefulDataLoader(dataset, "
            f"num_workers={loader.num_workers}, ...), which collects it, or num_workers=0",
        )
    return dataset


def _checked_batch_size(loader: DataLoader) -> int:
    """``loader``'s batch size, refusing a loader :func:`make_resumable` cannot rebuild without
    changing what it yields: one that shards itself, or one whose sampler's order a resumable
    sampler cannot repeat."""
    if isinstance(loader.sampler, DistributedSampler):
        raise ConfigError(
            "Run shards the data across ranks itself (so that a resume at another world size "
            "continues the same order); the loader's DistributedSampler would shard it twice",
            hint="build the loader as in a single process, DataLoader(dataset, batch_size=B, "
            "shuffle=True), without DistributedSampler",
        )
    if (
        loader.batch_size is None
        or type(loader.batch_sampler) is not BatchSampler
        or type(loader.sampler) not in (RandomSampler, SequentialSampler)
        or (isinstance(loader.sampler, RandomSampler) and loader.sampler.replacement)
        or (
            isinstance(loader.sampler, RandomSampler)
            and loader.sampler.num_samples != len(loader.dataset)  # type: ignore[arg-type]
        )
    ):
        raise ConfigError(
            "Run needs a DataLoader built with batch_size=... and shuffle=True or False; "
            "a plain DataLoader cannot resume custom samplers mid-epoch (its workers prefetch)",
            hint="build the loader as DataLoader(dataset, batch_size=B, shuffle=True, "
            "num_workers=K), or, for a sampler with state_dict()/load_state_dict(), as "
            "torchdata.stateful_dataloader.StatefulDataLoader(dataset, sampler=...)",
        )
    return loader.batch_size


def make_resumable(
    loader: DataLoader, seed: int, *, rank: int = 0, world: int = 1
) -> tuple[DataLoader, ResumableBatchSampler]:
    """A copy of ``loader`` whose batch order can be saved and resumed mid-epoch, yielding
    rank ``rank``'s share of each step of ``world`` ranks (``loader.batch_size`` is the
    per-rank batch).

    Accepts loaders built the usual way (``batch_size=..., shuffle=True/False``) over a
    map-style dataset.
    """
    batch_size = _checked_batch_size(loader)
    batches = ResumableBatchSampler(
        len(loader.dataset),  # type: ignore[arg-type]
        batch_size,
        shuffle=isinstance(loader.sampler, RandomSampler),
        drop_last=loader.drop_last,
        seed=seed,
        rank=rank,
        world=world,
    )
    extra: dict[str, Any] = {}
    if loader.num_workers > 0:
        extra["prefetch_factor"] = loader.prefetch_factor
        extra["persistent_workers"] = loader.persistent_workers
    resumable = DataLoader(
        SeededDataset(loader.dataset),
        batch_sampler=batches,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=WorkerInit(loader.worker_init_fn),  # workers ignore notice signals
        multiprocessing_context=loader.multiprocessing_context,
        generator=torch.Generator(),
        pin_memory_device=loader.pin_memory_device,
        **extra,
    )
    return resumable, batches
