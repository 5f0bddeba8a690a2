"""Resumable sampling: a mid-epoch resume yields exactly the batches the uninterrupted run would.

Three things make a ``DataLoader`` repeatable across a restart:

- the epoch's permutation is a function of (seed, epoch) and is saved with its position, so the
  resumed loader starts *at* the next batch instead of replaying earlier ones;
- the loader gets its own ``torch.Generator``, so creating an iterator never draws from the
  global torch RNG (which would shift dropout and everything after it);
- each batch carries a seed derived from (seed, epoch, batch index) that worker processes apply
  before loading it, so random augmentation in ``num_workers > 0`` does not depend on which
  worker got the batch or how long the workers had been running.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    get_worker_info,
)

from spotwise.errors import ConfigError, StateMismatchError
from spotwise.runtime.workers import WorkerInit


def derive_seed(*parts: int | str) -> int:
    """A well-mixed 63-bit seed from several parts (stable across Python versions)."""
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class SeededBatch(list):
    """A list of dataset indices that also carries the seed for loading it."""

    def __init__(self, indices: list[int], seed: int) -> None:
        super().__init__(indices)
        self.seed = seed


class ResumableBatchSampler(Sampler[list[int]]):
    """Yields the batches of one epoch, starting at ``position``; call :meth:`set_position`
    before each new iterator."""

    def __init__(
        self, size: int, batch_size: int, *, shuffle: bool, drop_last: bool, seed: int
    ) -> None:
        if batch_size < 1:
            raise ConfigError(f"batch_size must be at least 1, got {batch_size}")
        self.size, self.batch_size = size, batch_size
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.epoch = 0
        self.position = 0  # index of the next batch to yield within the epoch
        self._perm: tuple[int, torch.Tensor] | None = None  # (epoch, permutation)

    def __len__(self) -> int:
        if self.drop_last:
            return self.size // self.batch_size
        return (self.size + self.batch_size - 1) // self.batch_size

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

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.epoch
        perm = self.permutation(epoch).tolist()
        for b in range(self.position, len(self)):
            indices = perm[b * self.batch_size : (b + 1) * self.batch_size]
            yield SeededBatch(indices, derive_seed(self.seed, epoch, b, "batch"))

    def state_dict(self, epoch: int, position: int) -> dict[str, Any]:
        """The state for resuming at batch ``position`` of ``epoch`` (the training loop's
        position, which lags behind what prefetching workers have already drawn)."""
        return {
            "size": self.size,
            "batch_size": self.batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "seed": self.seed,
            "epoch": epoch,
            "position": position,
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
        self.seed = int(state["seed"])
        self.set_position(int(state["epoch"]), int(state["position"]))
        perm = state["permutation"]
        if perm.numel() != self.size:
            raise StateMismatchError("the saved permutation does not match the dataset size")
        self._perm = (self.epoch, perm.clone())


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


def stateful_source(loader: Any) -> Any | None:
    """What to checkpoint for a loader that keeps its own position, or None for a plain
    map-style ``DataLoader`` (which :func:`make_resumable` rebuilds around a resumable sampler).

    A loader with ``state_dict``/``load_state_dict`` (torchdata's ``StatefulDataLoader``) is
    saved through them, and so is the dataset of a ``DataLoader(num_workers=0)`` over an
    ``IterableDataset`` that has them (Hugging Face ``datasets`` iterable datasets do). What
    cannot say where it is is refused: replaying it from the start would train on some data
    twice and some never.
    """
    if has_state(loader):
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
    if loader.num_workers > 0:
        raise ConfigError(
            f"a DataLoader with num_workers={loader.num_workers} over an IterableDataset keeps "
            "the stream position in its worker processes, where Run cannot read it",
            hint="use torchdata.stateful_dataloader.StatefulDataLoader(dataset, "
            f"num_workers={loader.num_workers}, ...), which collects it, or num_workers=0",
        )
    return dataset


def make_resumable(loader: DataLoader, seed: int) -> tuple[DataLoader, ResumableBatchSampler]:
    """A copy of ``loader`` whose batch order can be saved and resumed mid-epoch.

    Accepts loaders built the usual way (``batch_size=..., shuffle=True/False``) over a
    map-style dataset.
    """
    inner = loader.batch_sampler
    if (
        loader.batch_size is None
        or type(inner) is not BatchSampler
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
    batches = ResumableBatchSampler(
        len(loader.dataset),  # type: ignore[arg-type]
        loader.batch_size,
        shuffle=isinstance(loader.sampler, RandomSampler),
        drop_last=loader.drop_last,
        seed=seed,
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
