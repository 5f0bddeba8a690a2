"""One small real Lightning run for the callback's resume tests: a dropout MLP fitted with a
LightningDataModule, appending one JSON line per training step to TRACE and printing
``final-weights-sha256: ...`` at the end.

argv: RUN_DIR TRACE MODE WORKERS [DATA]
  spotwise  SpotwiseCallback(RUN_DIR, every=3); fit(model, datamodule)
  plain     Lightning's own resume: ModelCheckpoint(every_n_train_steps=2, save_last=True) and
            fit(model, datamodule, ckpt_path="last") (what Lightning's docs say to do)
  DATA      "datamodule" (default: its loader keeps persistent workers) or "loaders": the same
            loader without persistent workers, passed as fit(model, train_dataloaders=...), or
            "ddp": the datamodule under strategy="ddp" with 2 CPU processes (gloo) started by
            Lightning's own launcher, each with half the batch (the same 5 steps an epoch)
"""

from __future__ import annotations

import hashlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 14  # 3 epochs of 5 batches, the last one cut short
SIZE, BATCH = 40, 8
SLEEP_S = 0.02  # per step, so that a kill can land anywhere


class Data(L.LightningDataModule):
    def __init__(self, workers: int, batch: int = BATCH) -> None:
        super().__init__()
        self.workers, self.batch = workers, batch

    def setup(self, stage: str) -> None:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(SIZE, 6, generator=g)
        self.train = TensorDataset(x, (x.sum(1) > 0).long())

    def train_dataloader(self, persistent: bool = True) -> DataLoader:
        return DataLoader(
            self.train,
            batch_size=self.batch,
            shuffle=True,
            num_workers=self.workers,
            persistent_workers=persistent and self.workers > 0,
        )


class Net(L.LightningModule):
    def __init__(self, trace: str) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 2))
        self.trace = trace

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = nn.functional.cross_entropy(self.net(x), y)
        line = {
            "rank": self.global_rank,
            "step": self.global_step,
            "loss": loss.float().item(),
            "x": x.sum().item(),
        }
        with open(self.trace, "a") as f:
            f.write(json.dumps(line) + "\n")
        time.sleep(SLEEP_S)
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.AdamW(self.parameters(), lr=0.05)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.7)
        return [opt], [{"scheduler": sched, "interval": "step"}]


def main() -> None:
    run_dir, trace, mode, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.manual_seed(1)
    model = Net(trace)
    kwargs: dict[str, Any] = {}
    data = sys.argv[5] if len(sys.argv) > 5 else "datamodule"
    world = 2 if data == "ddp" else 1
    if mode == "spotwise":
        from spotwise.integrations.lightning import SpotwiseCallback

        callbacks: list[Any] = [SpotwiseCallback(run_dir, every=2)]
        checkpointing = False
    else:
        callbacks = [ModelCheckpoint(dirpath=run_dir, every_n_train_steps=2, save_last=True)]
        checkpointing = True
        if (Path(run_dir) / "last.ckpt").exists():
            kwargs["ckpt_path"] = "last"
    trainer = L.Trainer(
        max_steps=STEPS,
        accelerator="cpu",
        precision="bf16-mixed",
        callbacks=callbacks,
        enable_checkpointing=checkpointing,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=run_dir + "-logs",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
    )
    datamodule = Data(workers, BATCH // world)
    if data == "loaders":
        datamodule.setup("fit")
        loader = datamodule.train_dataloader(persistent=False)
        trainer.fit(model, train_dataloaders=loader, **kwargs)
    else:
        trainer.fit(model, datamodule, **kwargs)
    resumed = callbacks[0].run.resumed_from if mode == "spotwise" else kwargs.get("ckpt_path")
    if resumed is not None:
        print(f"resumed-from: {getattr(resumed, 'step', resumed)}", flush=True)
    if trainer.global_rank > 0:  # the same weights on every rank: rank 0 prints them
        return
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    print(f"final-weights-sha256: {digest.hexdigest()}", flush=True)


if __name__ == "__main__":
    main()
