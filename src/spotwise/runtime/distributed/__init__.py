"""The ranks of a ``torch.distributed`` job as the Run sees them, and the few tiny collectives
it needs: agree on a verdict, broadcast rank 0's choice, gather small JSON documents, and the
per-step :class:`Agreement` on notices and timed saves.

A Run is distributed exactly when the user initialised a process group before creating it (as
under ``torchrun``); otherwise :func:`current` is None and nothing here runs. The collectives
travel over a gloo group of their own, created once per Run: a NCCL job does not put CPU
scalars on the GPU stream, and the agreement's reduction in flight never queues in front of
DDP's gradient buckets. Documents travel as UTF-8 JSON in byte tensors (``all_gather_object``
would pickle them).
"""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from spotwise.runtime.interval import agreement_interval


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
    every rank creates the Run's gloo group here together."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = dist.new_group(backend="gloo")
    return Ranks(dist.get_rank(), dist.get_world_size(), group)


_RELEASE_S = 1.0  # far beyond the microseconds a gloo worker needs to let go


@contextlib.contextmanager
def _released(*tensors: torch.Tensor) -> Iterator[None]:
    """Leave once gloo's worker thread has dropped its references to ``tensors``, which it
    does just after the collective completes. While it holds one, the tensor's Python object
    carries an extra reference; a worker that drops it during interpreter shutdown (the Run's
    last agreement comes right before ``SystemExit(75)``) must take the GIL there and aborts
    the process ("terminate called without an active exception": exit -6 instead of 75)."""
    before = _references(tensors)
    yield
    deadline = time.monotonic() + _RELEASE_S
    while _references(tensors) > before and time.monotonic() < deadline:
        time.sleep(0.0005)  # releases the GIL the worker may be waiting for


def _references(tensors: tuple[torch.Tensor, ...]) -> int:
    return sum(sys.getrefcount(t) for t in tensors)


def all_max(ranks: Ranks, values: list[int]) -> list[int]:
    """The element-wise maximum of ``values`` over all ranks (one all-reduce)."""
    tensor = torch.tensor(values, dtype=torch.int64)
    with _released(tensor):
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=ranks.group)
    return [int(v) for v in tensor.tolist()]


def all_agree(ranks: Ranks, ok: bool) -> bool:
    """True on every rank when ``ok`` is true on every rank."""
    return all_max(ranks, [0 if ok else 1]) == [0]


def broadcast_ints(ranks: Ranks, values: list[int] | None) -> list[int]:
    """Rank 0's ``values`` on every rank (the others pass None)."""
    size = torch.tensor([len(values) if values is not None else 0], dtype=torch.int64)
    with _released(size):
        dist.broadcast(size, src=0, group=ranks.group)
    data = torch.zeros(int(size.item()), dtype=torch.int64)
    if ranks.is_coordinator and values is not None:
        data = torch.tensor(values, dtype=torch.int64).reshape(-1)
    with _released(data):
        dist.broadcast(data, src=0, group=ranks.group)
    return [int(v) for v in data.tolist()]


def gather_json(ranks: Ranks, document: Any) -> list[Any]:
    """Every rank's JSON ``document``, in rank order, on every rank."""
    raw = torch.tensor(list(json.dumps(document).encode()), dtype=torch.uint8)
    lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(ranks.world)]
    length = torch.tensor([raw.numel()], dtype=torch.int64)
    with _released(length, *lengths):
        dist.all_gather(lengths, length, group=ranks.group)
    longest = max(int(n.item()) for n in lengths)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[: raw.numel()] = raw
    buffers = [torch.zeros(longest, dtype=torch.uint8) for _ in range(ranks.world)]
    with _released(padded, *buffers):
        dist.all_gather(buffers, padded, group=ranks.group)
    return [
        json.loads(bytes(buf[: int(n.item())].tolist()))
        for buf, n in zip(buffers, lengths, strict=True)
    ]


def round_trip_s(ranks: Ranks, repeats: int = 3) -> float:
    """The fastest of ``repeats`` blocking all-reduces of a few integers (a collective): what
    one agreement costs at most, since its reduction otherwise runs while a step computes."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        all_max(ranks, [0, 0, 0])
        times.append(time.perf_counter() - started)
    return min(times)


_MICROS = 1e6  # the agreement carries its measurements as integer microseconds


class Agreement:
    """The element-wise maximum over all ranks of what each proposed one agreement ago.

    Not every step boundary agrees: :meth:`boundary` does every
    :func:`~spotwise.runtime.interval.agreement_interval` steps, chosen from the agreement's
    cost (``cost_s``, at least a measured blocking round trip) and the step time measured
    between agreements, both carried in the reduction itself, so every rank gets the same
    interval at the same boundary. An agreement awaits the all-reduce started at the previous
    one and starts one for this boundary's proposal, so the reduction runs while the next
    steps compute and the step pays only for starting and collecting it. All ranks therefore
    act on a proposal at the same boundary, one interval after it was made (a notice's exit
    margin allows for two intervals)."""

    def __init__(
        self, ranks: Ranks, cost_s: float, clock: Callable[[], float] = time.perf_counter
    ) -> None:
        self.ranks = ranks
        self.every = 1  # steps between agreements, the same on every rank
        self._cost_s, self._clock = cost_s, clock
        self._since = 0  # boundaries since the last agreement
        self._last: float | None = None  # when the last agreement was
        self._pending: tuple[Any, torch.Tensor] | None = None

    def boundary(self, propose: Callable[[], list[int]]) -> list[int] | None:
        """Count one step boundary. Between agreements None (``propose`` is not called); at an
        agreement, the maximum of the previous proposals (zeros at the first)."""
        self._since += 1
        if self._since < self.every:
            return None
        started = self._clock()
        step_s = 0.0 if self._last is None else (started - self._last) / self._since
        self._since, self._last = 0, started
        proposal = propose()
        result = self.drain()
        agreed = [0] * len(proposal) if result is None else result[:-2]
        if result is not None:  # the same on every rank: decided from the reduced values
            self.every = agreement_interval(result[-2] / _MICROS, result[-1] / _MICROS)
        cost_s = max(self._cost_s, self._clock() - started)
        tensor = torch.tensor(
            [*proposal, round(cost_s * _MICROS), round(step_s * _MICROS)], dtype=torch.int64
        )
        work = dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=self.ranks.group, async_op=True)
        self._pending = (work, tensor)
        return agreed

    def drain(self) -> list[int] | None:
        """Await the reduction in flight, if any, and return its result."""
        if self._pending is None:
            return None
        work, tensor = self._pending
        self._pending = None
        work.wait()
        return [int(v) for v in tensor.tolist()]
