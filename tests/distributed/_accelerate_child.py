"""A two-process Accelerate training script (DDP over gloo on the CPU) under spotwise, started
by ``accelerate launch --multi_gpu --num_processes 2``; rank 0 prints the final weights' hash.

    _accelerate_child.py RUN_DIR STEPS SLEEP_S
"""

from __future__ import annotations

import hashlib
import sys
import time

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from spotwise import CheckpointConfig
from spotwise.integrations.accelerate import accelerated_run


def main() -> None:
    run_dir, steps, sleep_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(7)
    data = TensorDataset(torch.randn(96, 8, generator=g), torch.randint(0, 3, (96,), generator=g))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model, opt = accelerator.prepare(model, opt)
    loader = DataLoader(data, batch_size=4, shuffle=True)  # not prepared: Run shards it
    run = accelerated_run(
        accelerator,
        run_dir,
        state={"model": model, "optimizer": opt},
        loader=loader,
        steps=steps,
        checkpoint=CheckpointConfig(every=4),
    )
    if run.resumed_from is not None:
        print(f"resumed from step {run.step}", flush=True)
    for x, y in run:
        with accelerator.accumulate(model):
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
        assert accelerator.sync_gradients == run.sync_gradients
        time.sleep(sleep_s)
    if accelerator.is_main_process:
        digest = hashlib.sha256()
        for _, tensor in sorted(accelerator.unwrap_model(model).state_dict().items()):
            digest.update(tensor.contiguous().reshape(-1).view(torch.uint8).numpy())
        print("final-weights-sha256:", digest.hexdigest(), flush=True)


if __name__ == "__main__":
    main()
