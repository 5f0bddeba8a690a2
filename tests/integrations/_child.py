"""One small real training run for the resume tests: a dropout MLP trained through spotwise.Run
in one of the shapes users write, appending one JSON line per loop body to TRACE and printing
``final-weights-sha256: ...`` at the end.

argv: RUN_DIR TRACE MODE WORKERS
  accumulate  map-style loader, accumulate=4 (a line per micro-batch)
  stateful    torchdata StatefulDataLoader over an IterableDataset with state_dict (WORKERS)
  hf          Hugging Face datasets IterableDataset built in memory, DataLoader(num_workers=0)
  eval        an eval pass on its own loader every 5 steps, noise from Generators in run.extras
  accelerate  Hugging Face Accelerate, gradient_accumulation_steps=2, accelerator.accumulate()
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset, get_worker_info

from spotwise import CheckpointConfig, Run

STEPS = {"accumulate": 12, "stateful": 24, "hf": 24, "eval": 20, "accelerate": 16}
SIZE = 40  # samples: several epochs in every mode
SLEEP_S = 0.03  # per loop body, so that a kill can land anywhere


class Stream(IterableDataset):
    """A stream that knows where it is: an epoch counter and a position per worker shard, in
    a shuffled order of its epoch (what a resumable streaming dataset keeps)."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.epoch, self.pos = 0, 0

    def __iter__(self) -> Any:
        info = get_worker_info()
        shard, shards = (info.id, info.num_workers) if info is not None else (0, 1)
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(self.epoch))
        mine = order[shard::shards].tolist()
        while self.pos < len(mine):
            i = mine[self.pos]
            self.pos += 1
            yield self.x[i], self.y[i]
        self.epoch, self.pos = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])


def data() -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(7)
    return torch.randn(SIZE, 8, generator=generator), torch.randint(
        0, 3, (SIZE,), generator=generator
    )


def loader_for(mode: str, workers: int) -> Any:
    x, y = data()
    if mode == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(Stream(x, y), batch_size=4, num_workers=workers)
    if mode == "hf":
        import datasets

        table = datasets.Dataset.from_dict({"x": x.tolist(), "y": y.tolist()})
        # shuffled before streaming: a shuffle buffer is not part of datasets' state_dict
        stream = table.shuffle(seed=3).to_iterable_dataset(num_shards=4)
        return DataLoader(stream.with_format("torch"), batch_size=4)
    return DataLoader(TensorDataset(x, y), batch_size=4, shuffle=True, num_workers=workers)


def weights_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for _, tensor in sorted(model.state_dict().items()):
        digest.update(tensor.detach().reshape(-1).view(torch.uint8).numpy())
    return digest.hexdigest()


def main() -> None:
    run_dir, trace_path, mode, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    accelerator = None
    settings: dict[str, Any] = {
        "loader": loader_for(mode, workers),
        "steps": STEPS[mode],
        "checkpoint": CheckpointConfig(every=2),
        "seed": 11,
    }
    if mode == "accelerate":
        from accelerate import Accelerator

        from spotwise.integrations.accelerate import accelerated_run

        accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
        model, opt = accelerator.prepare(model, opt)
        run = accelerated_run(
            accelerator, run_dir, state={"model": model, "optimizer": opt}, **settings
        )
    else:
        accumulate = 4 if mode == "accumulate" else 1
        run = Run(run_dir, state={"model": model, "opt": opt}, accumulate=accumulate, **settings)
    if run.resumed_from is not None:
        print(f"resumed-from: {run.step}", flush=True)
    noise = run.extras.setdefault("noise", torch.Generator().manual_seed(5))
    mix = run.extras.setdefault("mix", np.random.default_rng(9))
    x_eval, y_eval = data()
    evaluation = DataLoader(TensorDataset(x_eval, y_eval), batch_size=10)
    trace = os.open(trace_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    micro = 0
    for batch in run:
        inputs, labels = (batch["x"], batch["y"]) if isinstance(batch, dict) else batch
        if mode == "eval":
            inputs = inputs + 0.01 * torch.randn(inputs.shape, generator=noise) * float(
                mix.random()
            )
        if accelerator is not None:
            with accelerator.accumulate(model):
                loss = nn.functional.cross_entropy(model(inputs), labels)
                accelerator.backward(loss)
                opt.step()  # Accelerate's optimizer steps only where gradients sync
                opt.zero_grad()
            assert accelerator.sync_gradients == run.sync_gradients, "windows out of step"
        else:
            loss = nn.functional.cross_entropy(model(inputs), labels)
            (loss / run.accumulate).backward()
        record: dict[str, Any] = {"step": run.step + 1, "micro": micro, "loss": loss.item().hex()}
        if accelerator is not None:
            micro = 0 if run.sync_gradients else micro + 1
        elif run.sync_gradients:
            opt.step()
            opt.zero_grad()
            micro = 0
        else:
            micro += 1
        if mode == "eval" and run.sync_gradients and (run.step + 1) % 5 == 0:
            os.write(trace, (json.dumps({"evaluating": run.step + 1}) + "\n").encode())
            model.eval()
            with torch.no_grad():
                total = 0.0
                for xe, ye in evaluation:
                    total += nn.functional.cross_entropy(model(xe), ye).item()
                    time.sleep(SLEEP_S)  # a kill can land inside the evaluation
            model.train()
            record["eval"] = total.hex()
        os.write(trace, (json.dumps(record) + "\n").encode())
        time.sleep(SLEEP_S)
    print(f"final-weights-sha256: {weights_sha256(model)}", flush=True)


if __name__ == "__main__":
    main()
