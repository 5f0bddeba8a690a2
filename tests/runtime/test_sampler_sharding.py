"""The resumable sampler under several ranks: one global order dealt across the ranks, a global
saved position, and resumes at the same or another world size (pure, no processes)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from spotwise.errors import ConfigError
from spotwise.runtime.sampler import (
    ResumableBatchSampler,
    derive_seed,
    make_resumable,
    stateful_source,
)

Batch = tuple[tuple[int, ...], int]  # (indices, seed)


def ranks(world: int, **settings_: Any) -> list[ResumableBatchSampler]:
    return [ResumableBatchSampler(rank=r, world=world, **settings_) for r in range(world)]


def batches(sampler: ResumableBatchSampler) -> list[Batch]:
    return [(tuple(b), b.seed) for b in sampler]  # type: ignore[attr-defined]


def dropped_at_end(remaining: int, batch_size: int, world: int, drop_last: bool) -> int:
    """The documented tail rule, stated on its own: how many of the epoch's last ``remaining``
    samples a world never trains on."""
    rest = remaining % (world * batch_size)
    if rest == 0:
        return 0
    if drop_last:
        return rest  # every per-rank batch is full
    if rest >= world or (batch_size > 1 and remaining >= world * batch_size):
        return 0
    return rest  # fewer samples than ranks and nothing to merge them with


def check_lockstep(per_rank: list[list[Batch]], batch_size: int) -> None:
    """Every rank runs the same number of steps (DDP would hang otherwise), each with a
    non-empty batch no larger than the loader's batch_size."""
    assert len({len(b) for b in per_rank}) == 1
    assert all(1 <= len(indices) <= batch_size for b in per_rank for indices, _ in b)


def samples(per_rank: list[list[Batch]]) -> list[int]:
    return [i for b in per_rank for indices, _ in b for i in indices]


@settings(max_examples=300, deadline=None)
@given(
    size=st.integers(1, 120),
    batch_size=st.integers(1, 6),
    world=st.integers(1, 4),
    new_world=st.integers(1, 4),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**31),
    cut=st.floats(0, 1),
)
def test_resume_at_any_world_sees_each_sample_once(
    size: int,
    batch_size: int,
    world: int,
    new_world: int,
    shuffle: bool,
    drop_last: bool,
    seed: int,
    cut: float,
) -> None:
    common = {"size": size, "batch_size": batch_size, "shuffle": shuffle, "drop_last": drop_last}
    before = ranks(world, seed=seed, **common)
    full = [batches(s) for s in before]
    check_lockstep(full, batch_size)
    steps = len(full[0])
    assert all(len(s) == steps for s in before)
    perm = before[0].permutation(0).tolist()
    # the uninterrupted epoch: each sample at most once, and only the documented tail is left out
    seen = samples(full)
    assert len(seen) == len(set(seen))
    assert sorted(seen) == sorted(perm[: size - dropped_at_end(size, batch_size, world, drop_last)])

    position = round(cut * steps)
    states = [s.state_dict(0, position) for s in before]
    assert len({(st_["consumed"], st_["position"]) for st_ in states}) == 1  # rank 0 saves it
    state = states[0]
    after = ranks(new_world, seed=seed + 1, **common)  # the loaded seed wins
    for s in after:
        s.load_state_dict(state)
    rest = [batches(s) for s in after]
    check_lockstep(rest, batch_size)
    assert all(len(s) == position + len(rest[0]) for s in after)

    if new_world == world:  # bit-identical: same batches, same seeds, on every rank
        assert rest == [b[position:] for b in full]
    trained = samples([b[:position] for b in full]) + samples(rest)
    counts = Counter(trained)
    assert max(counts.values(), default=1) == 1  # none twice
    remaining = size - state["consumed"]
    missing = dropped_at_end(remaining, batch_size, new_world, drop_last)
    if position == steps:  # saved after the epoch's last step: nothing left to train
        missing = dropped_at_end(size, batch_size, world, drop_last)
        assert rest == [[] for _ in after]
    # none skipped but the last samples of the order, which the tail rule leaves out
    assert sorted(trained) == sorted(perm[: size - missing])
    if not drop_last:  # at most world - 1 samples, and none in a single process
        assert missing < (new_world if position < steps else world)
    if new_world == world == 1:
        assert missing == 0 or drop_last

    # the next epoch is the new world's ordinary epoch, whatever the resumed one was
    for s, fresh in zip(after, ranks(new_world, seed=seed, **common), strict=True):
        s.set_position(1, 0)
        fresh.set_position(1, 0)
        assert batches(s) == batches(fresh)


def test_ranks_are_the_single_process_batches_dealt_out() -> None:
    """At every full step, rank r's batch is the batch a single process draws at index
    step * world + r, samples and augmentation seed alike: a world-size change keeps both."""
    common = {"size": 50, "batch_size": 4, "shuffle": True, "drop_last": False, "seed": 11}
    single = batches(ResumableBatchSampler(**common))
    sharded = [batches(s) for s in ranks(3, **common)]
    for step in range(3):  # the fourth full step is merged with the tail
        for rank in range(3):
            assert sharded[rank][step] == single[step * 3 + rank]
    # the tail: 50 - 48 = 2 samples, fewer than the 3 ranks, merged with the last full step
    # into two balanced steps of 7 and 7 samples (shares of 3 and 2)
    assert [len(b[-2][0]) for b in sharded] == [3, 2, 2]
    assert [len(b[-1][0]) for b in sharded] == [3, 2, 2]


def test_checkpoints_of_single_process_versions_resume_identically() -> None:
    """A checkpoint written before the global position existed holds the batch position only;
    it resumes at the same batch with the seeds earlier versions gave each batch."""
    sampler = ResumableBatchSampler(23, 4, shuffle=True, drop_last=False, seed=7)
    full = batches(sampler)
    assert [seed for _, seed in full] == [derive_seed(7, 0, b, "batch") for b in range(6)]
    legacy = {
        "size": 23,
        "batch_size": 4,
        "shuffle": True,
        "drop_last": False,
        "seed": 7,
        "epoch": 0,
        "position": 2,
        "permutation": sampler.permutation(0).clone(),
    }
    resumed = ResumableBatchSampler(23, 4, shuffle=True, drop_last=False, seed=0)
    resumed.load_state_dict(legacy)
    assert batches(resumed) == full[2:]
    assert resumed.state_dict(0, 4)["consumed"] == 16
    # and at two ranks it continues from sample 8 of the same order
    halves = ranks(2, size=23, batch_size=4, shuffle=True, drop_last=False, seed=0)
    for s in halves:
        s.load_state_dict(legacy)
    perm = sampler.permutation(0).tolist()
    assert sorted(samples([batches(s) for s in halves])) == sorted(perm[8:])


def test_bad_rank_or_world_and_unshardable_loaders_are_refused() -> None:
    with pytest.raises(ConfigError, match="rank 2 of world size 2"):
        ResumableBatchSampler(10, 2, shuffle=False, drop_last=False, seed=0, rank=2, world=2)
    data = TensorDataset(torch.arange(10))
    with pytest.raises(ConfigError, match="DistributedSampler would shard it twice") as info:
        make_resumable(
            DataLoader(data, sampler=DistributedSampler(data, num_replicas=2, rank=0)), seed=0
        )
    assert "without DistributedSampler" in (info.value.hint or "")

    class Stream(IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            return iter(range(3))

        def state_dict(self) -> dict[str, int]:
            return {}

        def load_state_dict(self, state: dict[str, int]) -> None:
            pass

    assert stateful_source(DataLoader(Stream())) is not None  # fine in one process
    with pytest.raises(ConfigError, match="cannot shard the stateful Stream across 2 ranks"):
        stateful_source(DataLoader(Stream()), world=2)
    loader, sampler = make_resumable(
        DataLoader(data, batch_size=3, shuffle=True), seed=0, rank=1, world=2
    )
    assert (sampler.rank, sampler.world, len(loader)) == (1, 2, 2)  # steps of 6, then 4 = 2+2
