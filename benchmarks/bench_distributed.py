"""spotwise.Run under torch.distributed: what coordination and sharded checkpoints cost.

Two gloo ranks on this machine (the script starts itself under torchrun), all figures medians
measured in the same run:

1. **Agreement**: the tiny all-reduce, every few steps as the Run does it, that makes every rank
   act on a notice (and on a time-based save) together: its time on the training thread per step
   (the slowest rank's) against the digits example's DDP step (same model, batch 32), timed
   over 400 steps at a time; the difference of the step times with and without it is printed
   too, but it is below this machine's noise.
2. **FSDP2 state** (``fully_shard`` per layer), large tensors and many small ones: a durable
   ``run.save()`` (spotwise files, CRCs, fsync, manifest, rename; DCP's plan of the first save
   reused by the later ones, as in a Run) against ``torch.distributed.checkpoint.save`` with
   ``FileSystemWriter`` (which fsyncs too), with its default planner (which plans every save)
   and with ``DefaultSavePlanner(enable_plan_caching=True)`` (which reuses its plan), the three
   interleaved save by save; the ratio's baseline is the faster of the two planners in the run
   (neither was faster in every run here), both printed; and a resume (a new Run reading the
   newest checkpoint, CRCs checked) against ``dcp.load``, interleaved load by load.
3. **Resharded load** (2 -> 1): one rank (a second torchrun) resumes the checkpoint the two
   ranks wrote, against ``dcp.load`` of the DCP checkpoint they saved.
4. **Stall** of a background save of the large FSDP2 state (``run.save(block=False)``: one
   all-reduce and the copy of this rank's shards into reused staging buffers; the
   write, fsync and commit follow in the background, outside the timing) against copying the
   same local shards into reused buffers with one ``torch._foreach_copy_``, and against the
   blocking part of ``dcp.async_save`` (its staging copy, into CPU storages that one reused
   ``DefaultStager`` keeps between saves, and the start of its writer thread; planning, write
   and fsync follow on that thread, on a process group of its own, outside the timing).

    .venv/bin/python benchmarks/bench_distributed.py            # ~1 GiB / 2,000 x 128 KiB
    .venv/bin/python benchmarks/bench_distributed.py --quick    # 64 MiB / 500 x 32 KiB
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ["SPOTWISE_PLATFORM"] = "none"  # never probe link-local metadata from a benchmark


def _median_s(fn: Callable[[], object], repeats: int) -> float:
    import torch.distributed as dist

    times = []
    for _ in range(repeats):
        dist.barrier()
        started = time.perf_counter()
        fn()
        dist.barrier()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


_STEPS = 400  # per timing: several agreement intervals, so each timing holds a share of them


def _agreement(rank: int, repeats: int) -> None:
    import torch
    from torch import nn

    from spotwise.runtime import distributed

    ranks = distributed.current()
    assert ranks is not None
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.2), nn.Linear(128, 10))
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    agreement = distributed.Agreement(ranks, distributed.round_trip_s(ranks))
    spent = [0.0]  # in the agreement, on this rank's training thread

    def agreed_step() -> None:  # as the Run's step boundary does
        step()
        started = time.perf_counter()
        agreement.boundary(lambda: [0, 0, 0])
        spent[0] += time.perf_counter() - started

    def steps(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            for _ in range(_STEPS):
                body()

        return run

    for _ in range(200):  # warm-up, in which the agreement measures its interval
        agreed_step()
    plain, agreed, inside, blocking, every = [], [], [], [], []
    for _ in range(repeats):  # interleaved, so drifting load hits both alike
        plain.append(_median_s(steps(step), 1) / _STEPS)
        spent[0] = 0.0
        agreed.append(_median_s(steps(agreed_step), 1) / _STEPS)
        inside.append(spent[0] / _STEPS)
        every.append(agreement.every)
        blocking.append(_median_s(lambda: distributed.all_max(ranks, [0, 0, 0]), 50))
    agreement.drain()
    step_s, with_s = statistics.median(plain), statistics.median(agreed)
    slowest = torch.tensor([statistics.median(inside)], dtype=torch.float64)
    torch.distributed.all_reduce(slowest, op=torch.distributed.ReduceOp.MAX)
    per_step_s = float(slowest.item())
    if rank == 0:
        print(f"digits-ddp-step-ms: {step_s * 1e3:.3f}  with-agreement-ms: {with_s * 1e3:.3f}")
        print(f"blocking-all-reduce-ms: {statistics.median(blocking) * 1e3:.3f}")
        print(f"agreement-every-steps: {min(every)}-{max(every)}")
        print(f"agreement-ms-per-step: {per_step_s * 1e3:.4f}")
        print(f"agreement-step-time-difference: {(with_s - step_s) / step_s:.4f} (noise-bound)")
        print(f"ratio-agreement-overhead: {per_step_s / step_s:.4f}")


def _fsdp_model(tensors: int, numel: int) -> Any:
    """``tensors`` square layers of about ``numel`` weights each, ``fully_shard`` per layer."""
    from torch import nn
    from torch.distributed.fsdp import fully_shard

    side = int(numel**0.5)
    layers = nn.ModuleList(nn.Linear(side, side, bias=False) for _ in range(tensors))
    for layer in layers:
        fully_shard(layer)
    return fully_shard(nn.Sequential(*layers))


def _sharded(label: str, tensors: int, numel: int, rank: int, repeats: int, root: Path) -> None:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import DefaultSavePlanner
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from spotwise import CheckpointConfig, Run

    model = _fsdp_model(tensors, numel)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    run_dir, dcp_dir = root / f"run-{label}", root / f"dcp-{label}"
    run = Run(
        run_dir, state={"model": model}, notices=None, checkpoint=CheckpointConfig(keep_last=2)
    )

    def save() -> None:
        run.step += 1  # a save of an already committed step would be skipped
        run.save()

    def dcp_save(planner: DefaultSavePlanner) -> Callable[[], None]:
        def save() -> None:
            if rank == 0:
                shutil.rmtree(dcp_dir, ignore_errors=True)
            dist.barrier()
            dcp.save(get_model_state_dict(model), checkpoint_id=str(dcp_dir), planner=planner)

        return save

    default = dcp_save(DefaultSavePlanner())
    cached = dcp_save(DefaultSavePlanner(enable_plan_caching=True))  # plans once, as a Run does
    ours, defaults, caches = [], [], []
    # interleaved save by save, so drifting load and the machine's state (its disk, its page
    # cache) hit all three alike
    for _ in range(repeats):
        ours.append(_median_s(save, 1))
        defaults.append(_median_s(default, 1))
        caches.append(_median_s(cached, 1))
    run.close()
    ours_save = statistics.median(ours)
    default_save, cached_save = statistics.median(defaults), statistics.median(caches)
    theirs_save = min(default_save, cached_save)
    ours_load, theirs_load = _loads(model, run_dir, dcp_dir, repeats)
    if rank == 0:
        suffix = "" if label == "large" else f"-{label}"
        print(f"state-{label}-mib: {total / 2**20:.0f} ({tensors} tensors)")
        print(f"spotwise-save-{label}-s: {ours_save:.3f}  dcp-save-{label}-s: {theirs_save:.3f}")
        planners = f"dcp-save-default-planner-{label}-s: {default_save:.3f}  "
        print(f"{planners}dcp-save-plan-caching-{label}-s: {cached_save:.3f}")
        print(f"spotwise-load-{label}-s: {ours_load:.3f}  dcp-load-{label}-s: {theirs_load:.3f}")
        print(f"ratio-dist-save-vs-dcp{suffix}: {theirs_save / ours_save:.2f}")
        print(f"ratio-dist-load-vs-dcp{suffix}: {theirs_load / ours_load:.2f}")


def _loads(model: Any, run_dir: Path, dcp_dir: Path, repeats: int) -> tuple[float, float]:
    """Median seconds of a resume (a new Run reading the newest checkpoint of ``run_dir``, CRCs
    checked) and of ``dcp.load`` from ``dcp_dir``, into ``model``, interleaved load by load."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from spotwise import Run

    state = get_model_state_dict(model)
    ours, theirs = [], []
    for _ in range(repeats):
        ours.append(
            _median_s(lambda: Run(run_dir, state={"model": model}, notices=None).close(), 1)
        )
        theirs.append(_median_s(lambda: dcp.load(state, checkpoint_id=str(dcp_dir)), 1))
    return statistics.median(ours), statistics.median(theirs)


def _slowest_rank_s(fn: Callable[[], object]) -> float:
    """How long ``fn`` took on the slowest rank, from a common start: without a barrier after
    it, which would also count the time the background write just started takes from it."""
    import torch
    import torch.distributed as dist

    dist.barrier()
    started = time.perf_counter()
    fn()
    took = torch.tensor([time.perf_counter() - started], dtype=torch.float64)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)
    return float(took.item())


def _stall(rank: int, repeats: int, root: Path, tensors: int, numel: int) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    from spotwise import CheckpointConfig, Run

    model = _fsdp_model(tensors, numel)
    run = Run(
        root / "run-stall",
        state={"model": model},
        notices=None,
        checkpoint=CheckpointConfig(keep_last=2),
    )

    def stage() -> None:
        run.step += 1  # a save of an already committed step would be skipped
        run.save(block=False)

    # DCP's writer thread runs collectives while the timings below run theirs: not on one group
    dcp_group, dcp_dir = dist.new_group(backend="gloo"), root / "dcp-async"
    stager = DefaultStager(StagingOptions(False, False, False, False))  # CPU: no pinning
    pending: list[Any] = []

    def dcp_stage() -> None:
        pending.append(
            dcp.async_save(
                get_model_state_dict(model),
                checkpoint_id=str(dcp_dir),
                process_group=dcp_group,
                async_stager=stager,
            )
        )

    shards = [p.to_local() for p in model.parameters()]
    buffers = [torch.empty_like(t) for t in shards]
    stalls, copies, dcp_stalls = [], [], []
    for _ in range(repeats + 1):  # rounds, so drifting load hits all alike; the first allocates
        stalls.append(_slowest_rank_s(stage))
        run.save()  # waits for the write and the commit, outside the timing
        copies.append(_slowest_rank_s(lambda: torch._foreach_copy_(buffers, shards)))
        if rank == 0:
            shutil.rmtree(dcp_dir, ignore_errors=True)
        dist.barrier()
        dcp_stalls.append(_slowest_rank_s(dcp_stage))
        pending.pop().result()  # the write and the commit, outside the timing
    run.close()
    stager.close()
    stall_s, copy_s = statistics.median(stalls[1:]), statistics.median(copies[1:])
    dcp_s = statistics.median(dcp_stalls[1:])
    if rank == 0:
        print(f"dist-stall-s: {stall_s:.4f}  copy-local-shards-s: {copy_s:.4f}")
        print(f"dcp-async-save-stall-s: {dcp_s:.4f}")
        print(f"ratio-dist-stall-vs-copy: {stall_s / copy_s:.2f}")
        print(f"ratio-dist-stall-vs-dcp-async: {stall_s / dcp_s:.2f}")


def _reshard_load(label: str, tensors: int, numel: int, repeats: int, root: Path) -> None:
    """On one rank: resume the Run of :func:`_sharded` (written by two ranks) and ``dcp.load``
    the DCP checkpoint they saved, both resharding 2 -> 1, interleaved."""
    model = _fsdp_model(tensors, numel)
    run_dir, dcp_dir = root / f"run-{label}", root / f"dcp-{label}"
    ours_s, theirs_s = _loads(model, run_dir, dcp_dir, repeats)
    suffix = "" if label == "large" else f"-{label}"
    ours_line = f"spotwise-reshard-load-{label}-s: {ours_s:.3f}"
    print(f"{ours_line}  dcp-reshard-load-{label}-s: {theirs_s:.3f}")
    print(f"ratio-dist-reshard-load-vs-dcp{suffix}: {theirs_s / ours_s:.2f}")


def _states(quick: bool) -> list[tuple[str, int, int]]:
    """``(label, tensors, numel)``: large, 8 square fp32 tensors of 1 GiB (64 MiB quick) in all;
    many small, 2,000 (500 quick) tensors of 128 (32) KiB."""
    mib = 64 if quick else 1024
    small = (500, 32 * 1024 // 4) if quick else (2000, 128 * 1024 // 4)
    return [("large", 8, mib * 2**20 // 4 // 8), ("small", *small)]


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    root = Path(args.dir)
    if args.reshard:  # the second torchrun, of one rank
        for label, tensors, numel in _states(args.quick):
            _reshard_load(label, tensors, numel, args.repeats, root)
        dist.destroy_process_group()
        return
    rank = dist.get_rank()
    _agreement(rank, 3 * args.repeats)
    for label, tensors, numel in _states(args.quick):
        _sharded(label, tensors, numel, rank, args.repeats, root)
        if label == "large":
            _stall(rank, args.repeats, root, tensors, numel)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small states, fewer repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dir", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--reshard", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.repeats is None:
        args.repeats = 3 if args.quick else 5
    if args.worker:
        worker(args)
        return
    with tempfile.TemporaryDirectory(prefix="bench-dist-", dir=os.getcwd()) as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        for ranks, extra in (("2", []), ("1", ["--reshard"])):  # then 2 -> 1
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
            command += [f"--nproc-per-node={ranks}", __file__, "--worker", "--dir", tmp, *extra]
            command += ["--repeats", str(args.repeats)] + (["--quick"] if args.quick else [])
            code = subprocess.run(command, env=env, check=False).returncode
            if code:
                sys.exit(code)


if __name__ == "__main__":
    main()
