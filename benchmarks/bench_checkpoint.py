#!/usr/bin/env python
"""Checkpoint speed against baselines measured in the same process, on the same disk.

Two states: "large" (--size-gb of float32 in 16 tensors) and "small" (2,000 tensors, 256 MiB in
all, sized like a real model's parameters plus optimizer moments). For each, medians over
--reps repetitions (the order of the contenders rotates each repetition) of:

- durable save: spotwise ``write_checkpoint`` (safetensors + JSON + manifest, CRC32C, fsync of
  every file and directory, rename; a state of 256 MiB or more in up to 4 tensor files, one
  writer thread each) vs writing the same bytes raw into one file + fsync, vs the
  same bytes raw into 4 files by 4 writer threads + fsync (a disk's multi-stream speed), vs
  ``torch.save`` + fsync and ``safetensors.torch.save_file`` + fsync, each save right after
  the one before it was deleted; then ours and the 4 raw writers again, each save --pause
  seconds after the deletion (see ``bench_saves``);
- async stall: how long ``run.save(block=False)`` of a real ``Run`` blocks (state walk, copy
  into its reused snapshot buffer, handing the write to its saving thread; the write and commit
  are waited for outside the timing) vs a plain ``copy_`` of every tensor into preallocated
  buffers;
- load: spotwise ``load_checkpoint`` (reads each file into one buffer, verifies CRC32C, views
  the tensors) vs a raw ``readinto`` of the same file; the page cache of the file is dropped
  (posix_fadvise DONTNEED after fsync) before every read, for both.

    python benchmarks/bench_checkpoint.py --size-gb 1 [--reps 5] [--pause 5] [--dir /path]

Besides the table (median times) it prints the ratio lines ``ratio-save-vs-raw: X`` and so on:
each is the median over repetitions of the ratio of two measurements taken back to back
(throughput ratios for save and load, time ratios for the stall).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

os.environ["SPOTWISE_PLATFORM"] = "none"  # never probe link-local metadata from a benchmark

import torch
from safetensors.torch import save_file

from spotwise import CheckpointConfig, Run
from spotwise.runtime.commit import load_checkpoint, write_checkpoint
from spotwise.runtime.format import byte_view

MiB = 1 << 20
WRITERS = 4  # streams of the parallel raw baseline
SPLIT = 64 * MiB  # tensors larger than this are dealt out in pieces of this size
Samples = dict[str, list[float]]  # seconds per repetition, aligned across contenders


def paired_ratio(samples: Samples, numerator: str, denominator: str) -> float:
    """Median over repetitions of numerator/denominator measured back to back: pairs share the
    machine's state at that moment, which cancels much of a shared machine's noise."""
    pairs = zip(samples[numerator], samples[denominator], strict=True)
    return statistics.median(a / b for a, b in pairs)


def large_state(size_gb: float) -> dict[str, torch.Tensor]:
    per = int(size_gb * (1 << 30)) // 16 // 4
    return {f"layer{i}.weight": torch.rand(per) for i in range(16)}


def small_state(count: int = 2000, total_mib: int = 256) -> dict[str, torch.Tensor]:
    """Parameter-like tensors (a third each: weights, Adam exp_avg, exp_avg_sq) of varied size."""
    g = torch.Generator().manual_seed(0)
    raw = torch.exp(torch.rand(count // 3 + 1, generator=g) * 8)  # sizes spread over ~3 decades
    elements = (raw / raw.sum() * (total_mib * MiB // 4 // 3)).long().clamp(min=1)
    state: dict[str, torch.Tensor] = {}
    for i, n in enumerate(elements.tolist()):
        for kind in ("param", "exp_avg", "exp_avg_sq"):
            if len(state) < count:
                state[f"{kind}.{i}"] = torch.rand(int(n), generator=g)
    return state


def nbytes(state: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in state.values())


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- contenders --------------------------------------------------------------------------------
def raw_write(state: dict[str, torch.Tensor], path: Path) -> None:
    write_views([byte_view(t) for t in state.values()], path)


def raw_parallel_write(state: dict[str, torch.Tensor], path: Path) -> None:
    """The same bytes in WRITERS files, one writer thread each (tensors dealt out largest first
    to the least loaded writer), every file fsynced, then the directory: what a disk reaches
    with several streams in flight."""
    groups: list[list[memoryview]] = [[] for _ in range(WRITERS)]
    loads = [0] * WRITERS
    views = sorted((byte_view(t) for t in state.values()), key=len, reverse=True)
    pieces = [v[i : i + SPLIT] for v in views for i in range(0, max(len(v), 1), SPLIT)]
    for piece in pieces:
        least = loads.index(min(loads))
        groups[least].append(piece)
        loads[least] += len(piece)
    path.mkdir()
    with ThreadPoolExecutor(max_workers=WRITERS) as pool:
        list(pool.map(write_views, groups, [path / f"part-{i}" for i in range(WRITERS)]))
    fsync_path(path)


def write_views(views: list[memoryview], path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for i in range(0, len(views), 512):
            batch = views[i : i + 512]
            total, done = sum(len(v) for v in batch), os.writev(fd, batch)
            if done != total:  # finish a short write piece by piece
                for v in batch:
                    skip = min(done, len(v))
                    done -= skip
                    rest = v[skip:]
                    while len(rest):
                        rest = rest[os.write(fd, rest) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def ours_write(state: dict[str, torch.Tensor], path: Path) -> None:
    write_checkpoint(path, 1, state, {"note": "bench"})


def torch_write(state: dict[str, torch.Tensor], path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())


def safetensors_write(state: dict[str, torch.Tensor], path: Path) -> None:
    save_file(state, str(path))
    fsync_path(path)


def raw_read(path: Path, size: int) -> torch.Tensor:
    buf = torch.empty(size, dtype=torch.uint8)
    view = memoryview(buf.numpy().data).cast("B")
    with open(path, "rb", buffering=0) as f:
        while len(view):
            n = f.readinto(view)
            if not n:
                raise OSError("short read")
            view = view[n:]
    return buf


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


SAVES: dict[str, Callable[[dict[str, torch.Tensor], Path], None]] = {
    "raw write+fsync": raw_write,
    f"raw write+fsync, {WRITERS} writers": raw_parallel_write,
    "spotwise save": ours_write,
    "torch.save+fsync": torch_write,
    "safetensors save_file+fsync": safetensors_write,
}
COLD = (f"raw write+fsync, {WRITERS} writers", "spotwise save")  # the contenders timed cold too


def bench_saves(
    state: dict[str, torch.Tensor], root: Path, reps: int, names: tuple[str, ...], pause: float
) -> Samples:
    """Each save starts ``pause`` seconds after the one before it was deleted. Back to back
    (0 s), a writer through the page cache reuses the pages its predecessor's files just
    freed; a few seconds later, as between the saves of a training run, a virtual machine
    that reports freed memory to its host (virtio-balloon free page reporting) has given them
    back, and each new page costs a trip to the host."""
    times: dict[str, list[float]] = {name: [] for name in names}
    for rep in range(reps):
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            target = root / f"save-{len(times[name])}"
            time.sleep(pause)
            times[name].append(timed(lambda: SAVES[name](state, target)))  # noqa: B023
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
            fsync_path(root)
    return times


class _Tensors:
    """The benchmark's state as one entry of a Run's ``state``."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.tensors = state


def bench_stall(state: dict[str, torch.Tensor], root: Path, reps: int) -> Samples:
    dests = [torch.empty_like(t) for t in state.values()]
    sources = list(state.values())

    def plain_copy() -> None:
        for d, s in zip(dests, sources, strict=True):
            d.copy_(s)

    config = CheckpointConfig(keep_last=1)
    run = Run(root / "stall", state={"main": _Tensors(state)}, notices=None, checkpoint=config)

    def ours() -> None:
        run.step += 1  # a save of an already committed step would be skipped
        run.save(block=False)

    times: dict[str, list[float]] = {"copy into reused buffers": [], "spotwise async stall": []}
    for rep in range(reps + 1):  # the first sizes the buffers (the baseline's are preallocated)
        pair = [("copy into reused buffers", plain_copy), ("spotwise async stall", ours)]
        for name, fn in pair if rep % 2 == 0 else pair[::-1]:
            times[name].append(timed(fn))
            run.save()  # waits for the write and the commit, outside the timing
    run.close()
    shutil.rmtree(root / "stall")
    return {name: samples[1:] for name, samples in times.items()}


def bench_loads(state: dict[str, torch.Tensor], root: Path, reps: int) -> Samples:
    ckpt = root / "load-src"
    write_checkpoint(ckpt, 1, state)
    step_dir = ckpt / "step-00000001"
    raw_file = root / "load-raw.bin"
    raw_write(state, raw_file)
    size = raw_file.stat().st_size
    files = [step_dir / name for name in os.listdir(step_dir)]

    def ours() -> None:
        loaded = load_checkpoint(step_dir)
        assert len(loaded.tensors) == len(state)

    times: dict[str, list[float]] = {"raw read": [], "spotwise load (verified)": []}
    for rep in range(2 * reps):
        order = ["raw read", "spotwise load (verified)"]
        for name in order if rep % 2 == 0 else order[::-1]:
            for f in [raw_file, *files]:
                drop_cache(f)
            fn = (lambda: raw_read(raw_file, size)) if name == "raw read" else ours
            times[name].append(timed(fn))
    shutil.rmtree(ckpt)
    raw_file.unlink()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="size of the large state")
    parser.add_argument("--reps", type=int, default=5, help="repetitions (medians are reported)")
    parser.add_argument("--dir", default=None, help="where to write (default: system temp dir)")
    parser.add_argument(
        "--pause",
        type=float,
        default=5.0,
        help="seconds between one save's deletion and the next save, for a second timing of "
        "our save and the 4 raw writers (as between a training run's saves); 0 skips it",
    )
    args = parser.parse_args()
    torch.manual_seed(0)
    root = Path(tempfile.mkdtemp(prefix="spotwise-bench-", dir=args.dir))
    print(f"writing under {root}", flush=True)
    ratios: dict[str, float] = {}
    try:
        for label, state in (("large", large_state(args.size_gb)), ("small", small_state())):
            size = nbytes(state)
            suffix = "" if label == "large" else "-small"
            print(f"\n{label}: {len(state)} tensors, {size / MiB:.0f} MiB", flush=True)
            reps = args.reps if label == "large" else 2 * args.reps  # small ones are cheap
            saves = bench_saves(state, root, reps, tuple(SAVES), 0.0)
            cold = bench_saves(state, root, reps, COLD, args.pause) if args.pause else {}
            stall = bench_stall(state, root, reps)
            loads = bench_loads(state, root, reps)
            print(f"{'measure':40s} {'median s':>10s} {'GiB/s':>8s}")
            cold = {f"{name} ({args.pause:g} s apart)": samples for name, samples in cold.items()}
            for name, samples in {**saves, **cold, **stall, **loads}.items():
                seconds = statistics.median(samples)
                print(f"{name:40s} {seconds:10.4f} {size / seconds / (1 << 30):8.2f}")
            ours = "spotwise save"
            ratios[f"ratio-save-vs-raw{suffix}"] = paired_ratio(saves, "raw write+fsync", ours)
            ratios[f"ratio-save-vs-raw-parallel{suffix}"] = paired_ratio(
                saves, f"raw write+fsync, {WRITERS} writers", ours
            )
            if cold:
                ratios[f"ratio-save-vs-raw-parallel-apart{suffix}"] = paired_ratio(
                    cold, *(f"{name} ({args.pause:g} s apart)" for name in COLD)
                )
            ratios[f"ratio-save-vs-torch-save{suffix}"] = paired_ratio(
                saves, "torch.save+fsync", ours
            )
            ratios[f"ratio-save-vs-safetensors{suffix}"] = paired_ratio(
                saves, "safetensors save_file+fsync", ours
            )
            ratios[f"ratio-stall-vs-copy{suffix}"] = paired_ratio(
                stall, "spotwise async stall", "copy into reused buffers"
            )
            ratios[f"ratio-load-vs-raw{suffix}"] = paired_ratio(
                loads, "raw read", "spotwise load (verified)"
            )
            del state
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print()
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}")


if __name__ == "__main__":
    main()
