"""Child process for the hostile-run-directory tests: train a tiny model with ``spotwise.Run``
(mirrored to a local object store) and print where it resumed from as JSON.

argv: RUN_DIR STORE STEPS KEEP_LAST
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from spotwise.checkpoint.retention import RetentionPolicy
from spotwise.runtime import CheckpointConfig, Run
from spotwise.runtime.tiered import TieredMirror
from spotwise.storage.local import LocalStorage


def train(run_dir: Path, store: Path, steps: int, keep_last: int) -> dict[str, int | None]:
    """Save every 2 steps; keep ``keep_last`` checkpoints locally and in the store."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    mirror = TieredMirror(LocalStorage(store), retention=RetentionPolicy(keep_last=keep_last))
    run = Run(
        run_dir,
        state={"model": model, "optimizer": optimizer},
        steps=steps,
        checkpoint=CheckpointConfig(every=2, keep_last=keep_last, mirror=mirror),
        notices=None,
    )
    resumed = run.resumed_from.step if run.resumed_from is not None else None
    for _ in run:
        model(torch.ones(1, 4)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    run.close()
    return {"resumed": resumed, "step": run.step}


if __name__ == "__main__":
    run_dir, store = map(Path, sys.argv[1:3])
    print(json.dumps(train(run_dir, store, int(sys.argv[3]), int(sys.argv[4]))))
