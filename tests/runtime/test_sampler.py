"""Resumable batches: mid-epoch resume yields exactly the remaining batches, workers included."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from spotwise.errors import ConfigError, StateMismatchError
from spotwise.runtime.sampler import ResumableBatchSampler, make_resumable, stateful_source


def batches(sampler: ResumableBatchSampler) -> list[list[int]]:
    return [list(b) for b in sampler]


def test_resume_mid_epoch_yields_the_rest() -> None:
    sampler = ResumableBatchSampler(23, 4, shuffle=True, drop_last=False, seed=7)
    full = batches(sampler)
    assert sorted(i for b in full for i in b) == list(range(23))
    state = sampler.state_dict(epoch=0, position=2)
    other = ResumableBatchSampler(23, 4, shuffle=True, drop_last=False, seed=99)
    other.load_state_dict(state)
    assert batches(other) == full[2:]
    # the next epoch is a different permutation, the same for both
    sampler.set_position(1, 0)
    other.set_position(1, 0)
    assert batches(sampler) == batches(other) != full


def test_saved_permutation_wins_over_recomputation() -> None:
    sampler = ResumableBatchSampler(10, 3, shuffle=True, drop_last=True, seed=1)
    state = sampler.state_dict(epoch=0, position=1)
    state["permutation"] = torch.arange(9, -1, -1)  # e.g. written by another torch version
    sampler.load_state_dict(state)
    assert batches(sampler) == [[6, 5, 4], [3, 2, 1]]


def test_changed_loader_is_refused() -> None:
    state = ResumableBatchSampler(10, 3, shuffle=True, drop_last=False, seed=1).state_dict(0, 0)
    with pytest.raises(StateMismatchError, match="batch_size was 3, now 4"):
        ResumableBatchSampler(10, 4, shuffle=True, drop_last=False, seed=1).load_state_dict(state)


class Noisy(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.tensor([float(i)]) + torch.rand(1)  # random augmentation


def read_epoch(loader: DataLoader, sampler: ResumableBatchSampler, position: int) -> list:
    sampler.set_position(0, position)
    assert loader.generator is not None
    loader.generator.manual_seed(5)
    return [b.clone() for b in loader]


def test_worker_randomness_is_a_function_of_the_batch() -> None:
    """Without per-batch seeds, batch 3 would come from a worker seeded at iterator start with a
    different history, so its random augmentation would differ after a resume."""
    base = DataLoader(Noisy(), batch_size=4, shuffle=True, num_workers=2)
    loader, sampler = make_resumable(base, seed=3)
    torch.manual_seed(0)
    full = read_epoch(loader, sampler, 0)
    torch.manual_seed(0)
    rest = read_epoch(loader, sampler, 3)
    assert all(torch.equal(a, b) for a, b in zip(full[3:], rest, strict=True))


def test_loader_does_not_consume_the_global_rng() -> None:
    loader, _ = make_resumable(
        DataLoader(TensorDataset(torch.arange(10)), batch_size=2, shuffle=True), seed=1
    )
    before = torch.get_rng_state()
    list(loader)
    assert torch.equal(before, torch.get_rng_state())


def test_unsupported_loaders_are_refused() -> None:
    data = TensorDataset(torch.arange(10))
    with pytest.raises(ConfigError, match="custom samplers"):
        make_resumable(DataLoader(data, sampler=[1, 2, 3]), seed=0)
    with pytest.raises(ConfigError, match="custom samplers"):
        make_resumable(
            DataLoader(data, sampler=torch.utils.data.RandomSampler(data, replacement=True)), seed=0
        )

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ConfigError, match="IterableDataset Stream mid-stream"):
        stateful_source(DataLoader(Stream()))
