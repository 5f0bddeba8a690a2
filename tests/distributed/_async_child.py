"""A DDP job for tests/distributed/test_async_save.py, started by torchrun: a small head trained
on top of a frozen feature table (a frozen backbone's weights, saved with every checkpoint), so
that each rank's share of a checkpoint is 16 MiB and its background write lasts long
enough for the test to catch the job in the middle of it.

    child.py RUN_DIR --steps N --save-every K [--table-mib M] [--step-sleep S]

Each rank prints ``resumed from step N`` when it resumed; rank 0 prints
``first-save-seen-in-step: N`` (the step whose body first found the directory of the first
interval save, on a run that started fresh) and ``final-weights-sha256: <hex>`` over the
trained parameters.
"""

from __future__ import annotations

import argparse
import hashlib
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from spotwise import CheckpointConfig, Run
from spotwise.checkpoint.format import step_dir_name

TABLES = 8  # DCP's planner deals replicated tensors out to the ranks: 4 each
WIDTH = 64


class FrozenTableHead(nn.Module):
    def __init__(self, rows: int) -> None:
        super().__init__()
        self.tables = nn.ParameterList(
            nn.Parameter(torch.randn(rows, WIDTH), requires_grad=False) for _ in range(TABLES)
        )
        self.head = nn.Sequential(
            nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Dropout(0.1), nn.Linear(WIDTH, 10)
        )

    def forward(self, index: torch.Tensor) -> torch.Tensor:
        features = torch.stack([table[index] for table in self.tables]).sum(0)
        return self.head(features)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--save-every", type=int, required=True)
    parser.add_argument("--table-mib", type=int, default=32)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rows = args.table_mib * 2**20 // (TABLES * WIDTH * 4)
    model = nn.parallel.DistributedDataParallel(FrozenTableHead(rows))
    optimizer = torch.optim.SGD(
        [p for p in model.parameters() if p.requires_grad], lr=0.05, momentum=0.9
    )
    data = torch.Generator().manual_seed(1)
    index, labels = torch.randint(0, rows, (512,), generator=data), torch.randint(0, 10, (512,))
    loader = DataLoader(TensorDataset(index, labels), batch_size=16, shuffle=True)
    run = Run(
        args.run_dir,
        state={"model": model, "optimizer": optimizer},
        loader=loader,
        steps=args.steps,
        checkpoint=CheckpointConfig(every=args.save_every),
        notices=None,
    )
    if run.resumed_from is not None:
        print(f"resumed from step {run.step}", flush=True)
    first_save = args.run_dir / step_dir_name(args.save_every)
    seen = run.resumed_from is not None
    for x, y in run:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if not seen and first_save.exists():
            seen = True
            if dist.get_rank() == 0:
                print(f"first-save-seen-in-step: {run.step + 1}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if dist.get_rank() == 0:
        digest = hashlib.sha256()
        for _, param in sorted(model.module.head.named_parameters()):
            digest.update(param.detach().contiguous().reshape(-1).view(torch.uint8).numpy())
        print(f"final-weights-sha256: {digest.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
