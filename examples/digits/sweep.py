#!/usr/bin/env python
"""An Optuna study over the digits MLP (learning rate, width, momentum) with spotwise.hpo: each
trial trains with its own spotwise.Run directory, so a trial whose worker is killed or
preempted is continued from its checkpoint by the next worker, with the same parameters.

    python examples/digits/sweep.py --trials 8 --storage sqlite:///runs/sweep.db \\
        --run-root runs/sweep

Run the same command in several terminals (or machines, with a shared database) to get several
workers; kill any of them at any moment and start it again. The trials' parameters are drawn up
front by a seeded sampler, so the study's result does not depend on who ran what or how often
they were interrupted. The last line it prints is

    study-sha256: <hex>

(SHA-256 over the sorted (trial number, params, value) of the COMPLETE trials).
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import optuna
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from train import load_digits

from spotwise import CheckpointConfig, Run
from spotwise.hpo import open_study, run_worker, study_sha256

SPACE = {
    "lr": optuna.distributions.FloatDistribution(0.01, 0.3, log=True),
    "hidden": optuna.distributions.CategoricalDistribution([32, 64, 128]),
    "momentum": optuna.distributions.FloatDistribution(0.5, 0.95),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--storage", required=True, help="SQLAlchemy URL of the study database")
    parser.add_argument("--run-root", required=True, help="trials' run directories (or s3://)")
    parser.add_argument("--study", default="digits", help="study name")
    parser.add_argument("--seed", type=int, default=0, help="seed of the parameter draw")
    parser.add_argument("--steps", type=int, default=60, help="optimizer steps per trial")
    parser.add_argument("--worker", default=None, help="this worker's name (default host:pid)")
    parser.add_argument("--lease-ttl", type=float, default=30.0, help="trial lease seconds")
    parser.add_argument(
        "--prune",
        action="store_true",
        help="prune with Optuna's MedianPruner (decisions then depend on timing)",
    )
    parser.add_argument(
        "--step-sleep",
        type=float,
        default=0.0,
        help="seconds to sleep per step, so interruption tests can act",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    x, y = load_digits()
    order = np.random.RandomState(0).permutation(len(x))
    test, train_idx = order[: len(x) // 5], order[len(x) // 5 :]
    train = TensorDataset(
        torch.tensor(x[train_idx] / 16.0, dtype=torch.float32), torch.tensor(y[train_idx])
    )
    x_test = torch.tensor(x[test] / 16.0, dtype=torch.float32)
    y_test = torch.tensor(y[test])

    def objective(trial: optuna.Trial, run_dir: str) -> float:
        lr = trial.suggest_float("lr", 0.01, 0.3, log=True)
        hidden = trial.suggest_categorical("hidden", [32, 64, 128])
        momentum = trial.suggest_float("momentum", 0.5, 0.95)
        torch.manual_seed(trial.number)
        model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        loader = DataLoader(train, batch_size=32, shuffle=True)
        run = Run(
            run_dir,
            state={"model": model, "optimizer": optimizer},
            loader=loader,
            steps=args.steps,
            checkpoint=CheckpointConfig(every=10),
            seed=trial.number,
        )
        if run.resumed_from is not None:
            resumed = trial.user_attrs.get("spotwise.resumed_steps", [])
            trial.set_user_attr("spotwise.resumed_steps", [*resumed, run.step])
            print(f"trial {trial.number}: resumed at step {run.step}", flush=True)
        for inputs, labels in run:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if args.step_sleep > 0:
                time.sleep(args.step_sleep)
            step = run.step + 1
            if step % 20 == 0:
                trial.report(accuracy(model, x_test, y_test), step)
                if trial.should_prune():
                    raise optuna.TrialPruned()
        value = accuracy(model, x_test, y_test)
        print(f"trial {trial.number}: accuracy {value:.4f} {trial.params}", flush=True)
        return value

    pruner = optuna.pruners.MedianPruner() if args.prune else optuna.pruners.NopPruner()
    study = open_study(
        args.storage,
        args.study,
        "maximize",
        SPACE,
        trials=args.trials,
        seed=args.seed,
        pruner=pruner,
    )
    done = run_worker(
        objective,
        study,
        args.storage,
        run_root=args.run_root,
        trials=args.trials,
        holder=args.worker,
        lease_ttl_s=args.lease_ttl,
    )
    print(
        f"worker {args.worker or '-'}: finished trials {done.finished}, took over {done.resumed}",
        flush=True,
    )
    best = study.best_trial
    print(f"best: trial {best.number} accuracy {best.value:.4f} {best.params}", flush=True)
    print(f"study-sha256: {study_sha256(study)}", flush=True)
    return 0


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean().item())


if __name__ == "__main__":
    sys.exit(main())
