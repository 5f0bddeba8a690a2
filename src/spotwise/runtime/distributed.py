"""The ranks of a ``torch.distributed`` job as the Run sees them, and the few tiny collectives
it needs: agree on a verdict, broadcast rank 0's choice, gather small JSON documents.

A Run is distributed exactly when the user initialised a process group before creating it (as
under ``torchrun``); otherwise :func:`current` is None and nothing here runs. The collectives
travel over a gloo group: the default group when it is gloo, otherwise one created once for the
Run, so that a NCCL job does not put CPU scalars on the GPU stream. Documents travel as UTF-8
JSON in byte tensors (``all_gather_object`` would pickle them).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class Ranks:
    """This process's place in the job and the group the Run's collectives use."""

    rank: int
    world: int
    group: Any  # a torch ProcessGroup (gloo)

    @property
    def is_coordinator(self) -> bool:
        return self.rank == 0


def current() -> Ranks | None:
    """The job's ranks when a default process group is initialised, else None. Collective:
    under a non-gloo backend every rank creates the gloo group here together."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = dist.group.WORLD if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    return Ranks(dist.get_rank(), dist.get_world_size(), group)


def all_max(ranks: Ranks, values: list[int]) -> list[int]:
    """The element-wise maximum of ``values`` over all ranks (one all-reduce)."""
    tensor = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=ranks.group)
    return [int(v) for v in tensor.tolist()]


def all_agree(ranks: Ranks, ok: bool) -> bool:
    """True on every rank when ``ok`` is true on every rank."""
    return all_max(ranks, [0 if ok else 1]) == [0]


def broadcast_ints(ranks: Ranks, values: list[int] | None) -> list[int]:
    """Rank 0's ``values`` on every rank (the others pass None)."""
    size = torch.tensor([len(values) if values is not None else 0], dtype=torch.int64)
    dist.broadcast(size, src=0, group=ranks.group)
    data = torch.zeros(int(size.item()), dtype=torch.int64)
    if ranks.is_coordinator and values is not None:
        data = torch.tensor(values, dtype=torch.int64).reshape(-1)
    dist.broadcast(data, src=0, group=ranks.group)
    return [int(v) for v in data.tolist()]


def gather_json(ranks: Ranks, document: Any) -> list[Any]:
    """Every rank's JSON ``document``, in rank order, on every rank."""
    raw = torch.tensor(list(json.dumps(document).encode()), dtype=torch.uint8)
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(ranks.world)]
    dist.all_gather(lengths, torch.tensor([raw.numel()], dtype=torch.int64), group=ranks.group)
    longest = max(int(n.item()) for n in lengths)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: raw.numel()] = raw
    buffers = [torch.zeros(longest, dtype=torch.uint8) for _ in range(ranks.world)]
    dist.all_gather(buffers, padded, group=ranks.group)
    return [
        json.loads(bytes(buf[: int(n.item())].tolist()))
        for buf, n in zip(buffers, lengths, strict=True)
    ]
