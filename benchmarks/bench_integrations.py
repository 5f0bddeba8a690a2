#!/usr/bin/env python
"""Training throughput of a Lightning fit with spotwise's callback vs. Lightning's own
``ModelCheckpoint``, at the same save interval, measured in one process on the same disk.

The model is an MLP (--width, 4 layers) trained with AdamW on random data, so a checkpoint
(weights plus two Adam moments) is large enough for saving to matter. Each contender fits
--steps steps from a fresh run directory and saves every --every steps; its steps/s is timed
from ``on_train_start`` to ``on_train_end`` (which includes the final save of both). The order
of the contenders alternates each repetition; the ratio line is the median over --reps of the
ratio of two back-to-back measurements:

    python benchmarks/bench_integrations.py [--steps 120] [--every 20] [--reps 3]

prints ``ratio-lightning-throughput: X`` (spotwise steps/s / ModelCheckpoint steps/s; spotwise
writes in the background, so >= 1.0 is expected when a save costs more than a step).

The same MLP trained by a Hugging Face ``transformers.Trainer`` (``--framework trainer``), with
``spotwise.integrations.transformers.SpotwiseCallback`` vs. the Trainer's own checkpoints
(``save_strategy="steps"``, ``save_steps=--every``, ``save_total_limit=1``), prints
``ratio-trainer-throughput: X`` the same way (``--framework all``, the default, runs both).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from spotwise.integrations.lightning import SpotwiseCallback


class Net(L.LightningModule):
    def __init__(self, width: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(3):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 10))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class Clock(Callback):
    """Wall time of the training loop itself (not Trainer start-up)."""

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.started = time.perf_counter()

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.seconds = time.perf_counter() - self.started


def fit(kind: str, root: Path, args: argparse.Namespace) -> float:
    """Steps per second of one fit of ``kind`` ("spotwise" or "lightning")."""
    run_dir = root / kind
    shutil.rmtree(run_dir, ignore_errors=True)
    torch.manual_seed(0)
    x = torch.randn(args.batch * 16, args.width)
    data = DataLoader(
        TensorDataset(x, torch.randint(0, 10, (len(x),))), batch_size=args.batch, shuffle=True
    )
    clock = Clock()
    if kind == "spotwise":
        saving: Callback = SpotwiseCallback(run_dir, every=args.every, keep_last=1, notices=None)
    else:  # keeps the newest checkpoint only, like keep_last=1
        saving = ModelCheckpoint(dirpath=run_dir, every_n_train_steps=args.every)
    trainer = L.Trainer(
        max_steps=args.steps,
        accelerator="cpu",
        callbacks=[saving, clock],
        enable_checkpointing=kind == "lightning",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root / f"{kind}-logs",
    )
    trainer.fit(Net(args.width), train_dataloaders=data)
    return args.steps / clock.seconds


class MLPForTrainer(nn.Module):
    """The same MLP as a model the Trainer accepts: ``forward(x, labels)`` returns the loss."""

    def __init__(self, width: int) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for _ in range(3):
            layers += [nn.Linear(width, width), nn.ReLU()]
        self.net = nn.Sequential(*layers, nn.Linear(width, 10))

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": nn.functional.cross_entropy(self.net(x), labels)}


def train(kind: str, root: Path, args: argparse.Namespace) -> float:
    """Steps per second of one ``Trainer.train()`` of ``kind`` ("spotwise" or "trainer"),
    timed from ``on_train_begin`` to ``on_train_end`` (the final save of both included)."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from spotwise.integrations.transformers import SpotwiseCallback

    class TrainerClock(TrainerCallback):
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            self.started = time.perf_counter()

        def on_train_end(self, *_: Any, **__: Any) -> None:
            self.seconds = time.perf_counter() - self.started

    run_dir = root / kind
    shutil.rmtree(run_dir, ignore_errors=True)
    torch.manual_seed(0)
    x = torch.randn(args.batch * 16, args.width)
    labels = torch.randint(0, 10, (len(x),))
    data = [{"x": x[i], "labels": labels[i]} for i in range(len(x))]
    clock = TrainerClock()
    own = kind == "trainer"
    training = TrainingArguments(
        output_dir=str(run_dir if own else root / f"{kind}-out"),
        max_steps=args.steps,
        per_device_train_batch_size=args.batch,
        learning_rate=1e-3,
        use_cpu=True,
        report_to=[],
        disable_tqdm=True,
        logging_strategy="no",
        save_strategy="steps" if own else "no",
        save_steps=args.every,
        save_total_limit=1,  # keeps the newest checkpoint only, like keep_last=1
    )
    callbacks: list[Any] = (
        [] if own else [SpotwiseCallback(run_dir, every=args.every, keep_last=1, notices=None)]
    )
    trainer = Trainer(
        model=MLPForTrainer(args.width),
        args=training,
        train_dataset=data,
        callbacks=[*callbacks, clock],
    )
    trainer.train()
    return args.steps / clock.seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dir", default=None, help="where the run directories go")
    parser.add_argument("--framework", choices=("all", "lightning", "trainer"), default="all")
    args = parser.parse_args()
    os.environ.setdefault("SPOTWISE_PLATFORM", "none")
    root = Path(tempfile.mkdtemp(prefix="bench-integrations-", dir=args.dir))
    contenders = {
        "lightning": (fit, "lightning", "ModelCheckpoint"),
        "trainer": (train, "trainer", "Trainer checkpoints"),
    }
    try:
        for framework, (measure, baseline, label) in contenders.items():
            if args.framework not in ("all", framework):
                continue
            ratios = []
            for rep in range(args.reps):
                order = ("spotwise", baseline) if rep % 2 == 0 else (baseline, "spotwise")
                rates = {kind: measure(kind, root, args) for kind in order}
                ratios.append(rates["spotwise"] / rates[baseline])
                print(
                    f"{framework} rep {rep}: spotwise {rates['spotwise']:.2f} steps/s, "
                    f"{label} {rates[baseline]:.2f} steps/s",
                    flush=True,
                )
            print(f"ratio-{framework}-throughput: {statistics.median(ratios):.3f}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
