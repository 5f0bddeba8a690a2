"""Batch inference and sweep overheads, each against a plain baseline measured in the same run.

Batch: spotwise.batch.run_batch (leases in SQLite, ledger entry + output file per shard, both
fsynced and renamed into place, CRC32C) against a plain ``torch.no_grad()`` loop over the same
shards writing the same safetensors files with ``safetensors.torch.save_file`` (no fsync, no
ledger, no leases). Same model, data, shard and batch size. The ratio is plain time / spotwise
time, the median over ``--repeats`` back-to-back pairs (order alternating): >= 0.95 is the
target. Prints ``ratio-batch-vs-plain: X`` and both throughputs.

Sweep: per-trial overhead of spotwise.hpo's worker loop (ask or take over a lease, heartbeat
thread, tell) with an objective that returns at once, against Optuna's own ``study.optimize``
on the same kind of SQLite storage. Prints ``sweep-claim-ms-per-trial``,
``sweep-takeover-ms-per-trial`` (continuing trials whose worker died) and
``optuna-plain-ms-per-trial``.

    .venv/bin/python benchmarks/bench_batch.py --items 200000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("SPOTWISE_PLATFORM", "none")

import optuna
import torch
from safetensors.torch import save_file
from torch.utils.data import DataLoader, Subset, TensorDataset

from spotwise.batch import run_batch
from spotwise.hpo import TrialLeases, open_study, run_worker


def _model(width: int) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, 10)).eval()  # fmt: skip


def plain(model, data, out: Path, shard_size: int, batch_size: int) -> float:
    started = time.perf_counter()
    out.mkdir(parents=True)
    with torch.no_grad():
        for shard, start in enumerate(range(0, len(data), shard_size)):
            idx = range(start, min(start + shard_size, len(data)))
            parts = [model(b[0]) for b in DataLoader(Subset(data, idx), batch_size=batch_size)]
            save_file({"y": torch.cat(parts)}, str(out / f"shard-{shard:06d}.safetensors"))
    return time.perf_counter() - started


def ours(model, data, out: Path, shard_size: int, batch_size: int) -> float:
    started = time.perf_counter()
    run_batch(data, lambda b: {"y": model(b[0])}, str(out), model=model, shard_size=shard_size,
              batch_size=batch_size, notices=None)  # fmt: skip
    return time.perf_counter() - started


def bench_batch(args: argparse.Namespace, root: Path) -> None:
    model = _model(args.width)
    data = TensorDataset(torch.randn(args.items, 256, generator=torch.Generator().manual_seed(1)))
    ratios: list[float] = []
    times: dict[str, list[float]] = {"plain": [], "spotwise": []}
    for r in range(args.repeats):
        order = [("plain", plain), ("spotwise", ours)]
        if r % 2:
            order.reverse()
        took = {}
        for name, fn in order:
            out = root / f"{name}-{r}"
            took[name] = fn(model, data, out, args.shard_size, args.batch_size)
            times[name].append(took[name])
            shutil.rmtree(out)
        ratios.append(took["plain"] / took["spotwise"])
    for name, ts in times.items():
        print(f"{name}-items-per-s: {args.items / statistics.median(ts):.0f}")
    print(f"ratio-batch-vs-plain: {statistics.median(ratios):.3f}")


def bench_sweep(args: argparse.Namespace, root: Path) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    space = {"x": optuna.distributions.FloatDistribution(-1, 1)}
    n = args.trials

    def objective(trial, run_dir):
        return trial.suggest_float("x", -1, 1) ** 2

    url = f"sqlite:///{root / 'claim.db'}"
    study = open_study(url, "b", "minimize", space, trials=n, seed=0)
    started = time.perf_counter()
    run_worker(objective, study, url, run_root=str(root / "runs"), trials=n, lease_ttl_s=60)
    print(f"sweep-claim-ms-per-trial: {(time.perf_counter() - started) / n * 1000:.1f}")

    url = f"sqlite:///{root / 'takeover.db'}"
    study = open_study(url, "b", "minimize", space, trials=n, seed=0)
    leases = TrialLeases(url)
    for _ in range(n):  # n trials started by workers that died at once (lease already expired)
        leases.take(study.ask()._trial_id, "dead", 0.0, new=True)
    started = time.perf_counter()
    done = run_worker(objective, study, url, run_root=str(root / "runs2"), trials=n,
                      lease_ttl_s=60)  # fmt: skip
    assert len(done.resumed) == n
    print(f"sweep-takeover-ms-per-trial: {(time.perf_counter() - started) / n * 1000:.1f}")

    plain_study = optuna.create_study(storage=f"sqlite:///{root / 'plain.db'}")
    started = time.perf_counter()
    plain_study.optimize(lambda t: t.suggest_float("x", -1, 1) ** 2, n_trials=n)
    print(f"optuna-plain-ms-per-trial: {(time.perf_counter() - started) / n * 1000:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("--shard-size", type=int, default=5000)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--width", type=int, default=1024, help="hidden width of the MLP")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=40, help="trials for the sweep overhead")
    args = parser.parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 2) // 2))
    with tempfile.TemporaryDirectory(prefix="spotwise-bench-batch-") as tmp:
        bench_batch(args, Path(tmp))
        bench_sweep(args, Path(tmp))


if __name__ == "__main__":
    main()
