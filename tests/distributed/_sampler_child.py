"""Child of the sampler world-change test: one rank reading a DataLoader through the resumable
sampler that spotwise.Run wraps it in, logging every sample it is given, in lockstep with the
other ranks.

argv: WORKDIR TAG LOAD|- SEGMENTS SAVE|-
  SEGMENTS is ``epoch:steps,...`` (``steps`` ``end`` = to the end of the epoch); the position
  starts at the loaded state's (or epoch 0, batch 0) and moves on from epoch to epoch. Under
  torchrun (gloo) each step all-reduces a counter, as DDP's gradient all-reduce would, so a
  rank with one step more than the others hangs instead of passing. Every rank writes the state
  it would save (JSON, the permutation as a list) to ``SAVE.rank<r>.json``.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from spotwise.runtime import Run
from spotwise.runtime.sampler import ResumableBatchSampler

SIZE, BATCH, SEED = 45, 4, 5

workdir, tag, load, segments, save = Path(sys.argv[1]), *sys.argv[2:6]
if "WORLD_SIZE" in os.environ:
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank = dist.get_rank() if dist.is_initialized() else 0
world = dist.get_world_size() if dist.is_initialized() else 1

# the Run wraps the loader (its own saving under several ranks is not what this test is about:
# the loop below positions the loader the way Run's does, and saves the sampler's state itself)
run = Run(
    workdir / f"run.{tag}.rank{rank}",
    loader=DataLoader(
        TensorDataset(torch.arange(SIZE)), batch_size=BATCH, shuffle=True, num_workers=1
    ),
    seed=SEED,
    notices=None,
)
loader, sampler = run.loader, run.loader.batch_sampler
assert isinstance(sampler, ResumableBatchSampler)
assert (sampler.rank, sampler.world) == (rank, world)
epoch = position = 0
if load != "-":
    state = json.loads((workdir / f"{load}.rank0.json").read_text())
    state["permutation"] = torch.tensor(state["permutation"], dtype=torch.int64)
    sampler.load_state_dict(state)
    epoch, position = state["epoch"], state["position"]

with (workdir / f"log.{tag}.rank{rank}.txt").open("w") as log:
    for segment in segments.split(","):
        wanted, steps = segment.split(":")
        if int(wanted) != epoch:
            epoch, position = int(wanted), 0
        sampler.set_position(epoch, position)
        for taken, (batch,) in enumerate(loader):
            log.writelines(f"{epoch} {int(i)}\n" for i in batch)
            position += 1
            if dist.is_initialized():
                dist.all_reduce(torch.ones(1))
            if steps != "end" and taken + 1 == int(steps):
                break
    if dist.is_initialized():  # the ranks ran the same number of steps
        counts = [torch.tensor([position]) for _ in range(world)]
        dist.all_gather(counts, torch.tensor([position]))
        assert len({int(c) for c in counts}) == 1, counts

if save != "-":
    state = sampler.state_dict(epoch, position)
    state["permutation"] = state["permutation"].tolist()
    (workdir / f"{save}.rank{rank}.json").write_text(json.dumps(state))
run.close()
if dist.is_initialized():
    dist.destroy_process_group()
